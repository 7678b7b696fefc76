/**
 * The GPU panel: per GPU its figures and sparklines, then this container's
 * processes on its GPUs (by kernel and notebook), or why there is no GPU.
 */
import { Widget } from '@lumino/widgets';

import { IGpu, IHistory, IProcess, IProcesses, IStatus, Series } from './api';
import {
  DEFAULT_THRESHOLDS,
  IThresholds,
  celsius,
  clock,
  gib,
  gpuLevel,
  lastGoodText,
  memory,
  noGpuExplanation,
  percent,
  watts
} from './format';
import { buildLogUrl } from './image';
import { GpuModel } from './model';

const SVG = 'http://www.w3.org/2000/svg';

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls = '',
  text = ''
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  if (cls) {
    node.className = cls;
  }
  if (text) {
    node.textContent = text;
  }
  return node;
}

/** A polyline of the series scaled into [0, max]; gaps where a value is missing. */
export function sparkline(values: Series, max: number, label: string): SVGSVGElement {
  const w = 160;
  const h = 32;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', `0 0 ${w} ${h}`);
  svg.setAttribute('class', 'jp-gpulab-Sparkline');
  svg.setAttribute('role', 'img');
  svg.setAttribute('aria-label', label);
  const n = values.length;
  let d = '';
  let pen = false;
  values.forEach((v, i) => {
    if (v === null || !isFinite(v) || max <= 0) {
      pen = false;
      return;
    }
    const x = n > 1 ? (i / (n - 1)) * w : w;
    const y = h - 1 - (Math.min(Math.max(v, 0), max) / max) * (h - 2);
    d += `${pen ? 'L' : 'M'}${x.toFixed(1)},${y.toFixed(1)} `;
    pen = true;
  });
  const path = document.createElementNS(SVG, 'path');
  path.setAttribute('d', d.trim());
  svg.appendChild(path);
  return svg;
}

export class GpuPanel extends Widget {
  thresholds: IThresholds = { ...DEFAULT_THRESHOLDS };

  constructor(private model: GpuModel) {
    super();
    this.addClass('jp-gpulab-Panel');
    this.node.setAttribute('data-gpulab', 'panel');
    model.changed.connect(this.render, this);
    this.render();
  }

  protected onAfterAttach(): void {
    this.model.detailed = true;
  }

  protected onBeforeDetach(): void {
    this.model.detailed = false;
  }

  dispose(): void {
    this.model.changed.disconnect(this.render, this);
    this.model.detailed = false;
    super.dispose();
  }

  render(): void {
    const { status, history, processes, stale } = this.model;
    const body = el('div', 'jp-gpulab-PanelBody');
    body.appendChild(el('h2', '', 'GPU status of this server'));
    const image = this.model.image;
    if (image && image.state === 'last-good') {
      body.appendChild(this.renderLastGood(image.note, image.build_log_url));
    }
    if (stale && stale.noAccess) {
      // Refused: nothing of the project is shown any more, and retrying cannot help.
      const box = el('p', 'jp-gpulab-Error jp-gpulab-StaleNotice', `${stale.detail}.`);
      box.setAttribute('data-gpulab', 'no-access');
      body.appendChild(box);
      this.node.replaceChildren(body);
      return;
    }
    const sharing = status ? status.sharing : null;
    if (sharing) {
      // WSL2: every project shares the GPU and NVML cannot measure it; a sampler error
      // there is that, not a fault to retry.
      const box = el('p', 'jp-gpulab-Shared', sharing.words);
      box.setAttribute('data-gpulab', 'shared');
      body.appendChild(box);
    }
    if (stale && !(sharing && !this.model.error)) {
      // The last numbers stay, greyed and dated: never shown as if they were current.
      body.classList.add('jp-gpulab-is-stale');
      const from =
        stale.numbersFrom === null ? '' : ` The numbers below are from ${clock(stale.numbersFrom)}.`;
      const text = `Stale: ${stale.detail}.${from} Retrying.`;
      const box = el('p', 'jp-gpulab-Error jp-gpulab-StaleNotice', text);
      box.setAttribute('data-gpulab', 'stale');
      body.appendChild(box);
    }
    if (!status) {
      body.appendChild(el('p', '', 'Waiting for the first sample…'));
    } else if (!status.available && !sharing) {
      body.appendChild(this.renderNoGpu(status));
    } else if (sharing) {
      const cards = el('div', 'jp-gpulab-Cards');
      status.gpus.forEach(g => cards.appendChild(this.renderGpu(g, history)));
      body.appendChild(cards);
      body.appendChild(
        el('p', 'jp-gpulab-Empty', 'Per-process GPU memory is not available on WSL2.')
      );
    } else {
      const cards = el('div', 'jp-gpulab-Cards');
      status.gpus.forEach(g => cards.appendChild(this.renderGpu(g, history)));
      body.appendChild(cards);
      body.appendChild(this.renderProcesses(status, processes));
      body.appendChild(this.renderFooter(status));
    }
    this.node.replaceChildren(body);
  }

  private renderLastGood(note: string, logPath: string): HTMLElement {
    const box = el('p', 'jp-gpulab-LastGood', lastGoodText(note) + ' ');
    box.setAttribute('data-gpulab', 'last-good');
    const url = buildLogUrl(logPath);
    if (url) {
      const link = el('a', '', 'Open build log');
      link.href = url;
      link.target = '_blank';
      link.rel = 'noopener';
      box.appendChild(link);
    }
    return box;
  }

  private renderNoGpu(status: IStatus): HTMLElement {
    const box = el('div', 'jp-gpulab-NoGpu');
    box.dataset.reason = status.reason || '';
    const { title, hint } = noGpuExplanation(status.reason);
    box.appendChild(el('div', 'jp-gpulab-NoGpuBadge', 'No GPU'));
    box.appendChild(el('h3', '', title));
    box.appendChild(el('p', 'jp-gpulab-Reason', status.message));
    box.appendChild(el('p', 'jp-gpulab-Hint', status.hint || hint));
    return box;
  }

  private renderGpu(g: IGpu, history: IHistory | null): HTMLElement {
    const card = el('div', `jp-gpulab-Card jp-gpulab-level-${gpuLevel(g, this.thresholds)}`);
    card.dataset.uuid = g.uuid;
    const head = el('div', 'jp-gpulab-CardHead');
    head.appendChild(el('span', 'jp-gpulab-GpuIndex', `GPU ${g.index}`));
    head.appendChild(el('span', 'jp-gpulab-GpuName', g.name));
    if (g.mig) {
      head.appendChild(el('span', 'jp-gpulab-Badge', 'MIG slice'));
    }
    card.appendChild(head);
    card.appendChild(el('div', 'jp-gpulab-Uuid', g.uuid));
    const series = history ? history.gpus[g.uuid] : undefined;
    const rows: [string, string, Series | undefined, number][] = [
      ['Utilization', percent(g.utilization), series?.utilization, 100],
      [
        'Memory',
        memory(g.memory_used, g.memory_total),
        series?.memory_used,
        g.memory_total || 0
      ],
      ['Temperature', celsius(g.temperature), series?.temperature, 100],
      ['Power', watts(g.power_draw, g.power_limit), series?.power_draw, g.power_limit || 0]
    ];
    const table = el('div', 'jp-gpulab-Metrics');
    for (const [name, value, values, max] of rows) {
      const row = el('div', 'jp-gpulab-Metric');
      row.appendChild(el('span', 'jp-gpulab-MetricName', name));
      row.appendChild(el('span', 'jp-gpulab-MetricValue', value));
      const spark = el('span', 'jp-gpulab-MetricSpark');
      if (values && values.some(v => v !== null)) {
        const top = max > 0 ? max : Math.max(...values.map(v => v || 0), 1);
        spark.appendChild(sparkline(values, top, `${name} over the last minutes`));
      }
      row.appendChild(spark);
      table.appendChild(row);
    }
    if (g.pcie_tx !== undefined) {
      const row = el('div', 'jp-gpulab-Metric');
      row.appendChild(el('span', 'jp-gpulab-MetricName', 'PCIe TX/RX'));
      row.appendChild(el('span', 'jp-gpulab-MetricValue', `${gib(g.pcie_tx)}/${gib(g.pcie_rx)} GiB/s`));
      table.appendChild(row);
    }
    card.appendChild(table);
    return card;
  }

  private renderProcesses(status: IStatus, procs: IProcesses | null): HTMLElement {
    const box = el('div', 'jp-gpulab-Processes');
    box.appendChild(el('h3', '', 'Processes of this container on its GPUs'));
    if (!procs) {
      box.appendChild(el('p', '', 'Reading the process list…'));
      return box;
    }
    if (procs.processes.length === 0 && procs.other.length === 0) {
      box.appendChild(el('p', 'jp-gpulab-Empty', 'No process holds GPU memory.'));
      return box;
    }
    const table = el('table', 'jp-gpulab-ProcessTable');
    const head = el('tr');
    for (const h of ['PID', 'Kernel / notebook', 'Command', 'GPU', 'GPU memory']) {
      head.appendChild(el('th', '', h));
    }
    table.appendChild(head);
    for (const p of procs.processes) {
      table.appendChild(this.renderProcess(p));
    }
    for (const o of procs.other) {
      const tr = el('tr', 'jp-gpulab-Other');
      tr.appendChild(el('td', '', '—'));
      tr.appendChild(el('td', '', `${o.count} other process${o.count === 1 ? '' : 'es'}`));
      tr.appendChild(el('td', '', 'not matched to this container'));
      tr.appendChild(el('td', '', o.index === null ? '?' : String(o.index)));
      tr.appendChild(el('td', '', `${gib(o.memory_used)} GiB`));
      table.appendChild(tr);
    }
    box.appendChild(table);
    return box;
  }

  private renderProcess(p: IProcess): HTMLElement {
    const tr = el('tr');
    tr.dataset.pid = String(p.pid);
    tr.appendChild(el('td', '', String(p.pid)));
    const k = p.kernel;
    const job = p.job ? `job ${p.job}` : '';
    const who = k ? `${k.path || k.session || 'kernel'} (${k.name} kernel)` : job || p.name;
    tr.appendChild(el('td', k ? 'jp-gpulab-Kernel' : '', who));
    const cmd = el('td', 'jp-gpulab-Command', p.command);
    cmd.title = p.command;
    tr.appendChild(cmd);
    tr.appendChild(el('td', '', p.gpus.map(g => (g.index === null ? '?' : g.index)).join(', ')));
    const mem = p.gpus.map(g => (g.memory_used === null ? 'unknown' : `${gib(g.memory_used)} GiB`));
    tr.appendChild(el('td', '', mem.join(', ')));
    return tr;
  }

  private renderFooter(status: IStatus): HTMLElement {
    const driver = status.driver_version ? `Driver ${status.driver_version} · ` : '';
    const text =
      `${driver}sampled every ${status.interval} s on the server ` +
      `(processes every ${status.process_interval} s); ` +
      `history of the last ${Math.round(status.history_seconds / 60)} minutes`;
    return el('p', 'jp-gpulab-Footer', text);
  }
}
