/**
 * The status bar item: `GPU 43% · 12.1/80 GiB`, coloured by the thresholds, or `No GPU`;
 * greyed `GPU — stale (…)` when the server does not answer or its sampler failed.
 */
import { Widget } from '@lumino/widgets';

import {
  DEFAULT_THRESHOLDS,
  IThresholds,
  staleText,
  staleTitle,
  statusLevel,
  statusText,
  statusTitle
} from './format';
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
    const stale = m.stale;
    const level = stale ? 'stale' : statusLevel(m.status, this.thresholds);
    this.node.textContent = stale ? staleText(stale) : statusText(m.status);
    this.node.title = stale ? staleTitle(stale, m.status) : statusTitle(m.status, '');
    this.node.dataset.level = level;
    for (const l of ['ok', 'warning', 'critical', 'none', 'stale']) {
      this.node.classList.toggle(`jp-gpulab-level-${l}`, l === level);
    }
  }

  dispose(): void {
    this.model.changed.disconnect(this.render, this);
    super.dispose();
  }
}
