/**
 * The status bar item: `GPU 43% · 12.1/80 GiB`, coloured by the thresholds, or `No GPU`.
 */
import { Widget } from '@lumino/widgets';

import { DEFAULT_THRESHOLDS, IThresholds, statusLevel, statusText, statusTitle } from './format';
import { GpuModel } from './model';

export class GpuStatusItem extends Widget {
  thresholds: IThresholds = { ...DEFAULT_THRESHOLDS };

  constructor(
    private model: GpuModel,
    onClick: () => void
  ) {
    super();
    this.addClass('jp-gpulab-StatusItem');
    this.node.setAttribute('role', 'button');
    this.node.setAttribute('data-gpulab', 'status');
    this.node.addEventListener('click', onClick);
    model.changed.connect(this.render, this);
    this.render();
  }

  render(): void {
    const m = this.model;
    const level = m.error ? 'none' : statusLevel(m.status, this.thresholds);
    this.node.textContent = m.error && !m.status ? 'GPU ?' : statusText(m.status);
    this.node.title = statusTitle(m.status, m.error);
    this.node.dataset.level = level;
    for (const l of ['ok', 'warning', 'critical', 'none']) {
      this.node.classList.toggle(`jp-gpulab-level-${l}`, l === level);
    }
  }

  dispose(): void {
    this.model.changed.disconnect(this.render, this);
    super.dispose();
  }
}
