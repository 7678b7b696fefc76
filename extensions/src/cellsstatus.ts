/**
 * The status bar says when cells run on the server: "Cell running · 3 min", and
 * "Cell running while you were away · 42 min" for one that started before this page
 * was opened (a closed laptop, a lost VPN), with how many more wait behind it.
 * Read from ``GET /api/gpulab/v1/cells`` (gpulab_jupyter/cells.py) every few
 * seconds; asking is no activity.
 */
import { JupyterFrontEndPlugin } from '@jupyterlab/application';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { requestAPI } from './api';
import { serverSideHere } from './serverexec';

export interface IRunningCell {
  cell_id: string | null;
  path: string | null;
  since: number;
  seconds: number;
}

export interface ICells {
  running: IRunningCell[];
  queued: number;
}

/** "42 s", "3 min", "2 h 5 min". */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) {
    return `${s} s`;
  }
  const m = Math.floor(s / 60);
  if (m < 60) {
    return `${m} min`;
  }
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

/** The item's words ('' when nothing runs); ``openedAt``: when this page loaded (Unix s). */
export function cellsText(cells: ICells | null, openedAt: number): string {
  if (!cells || cells.running.length === 0) {
    if (!cells || !cells.queued) {
      return '';
    }
    return `${cells.queued} ${cells.queued === 1 ? 'cell' : 'cells'} queued`;
  }
  const first = cells.running[0];
  const away = first.since < openedAt - 2;
  const more = cells.queued ? ` (+${cells.queued} queued)` : '';
  const what = away ? 'Cell running while you were away' : 'Cell running';
  return `${what} · ${duration(first.seconds)}${more}`;
}

const cellsStatus: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:cells-status',
  description: "Says in the status bar that a cell runs on the server's side, and since when.",
  autoStart: true,
  optional: [IStatusBar],
  activate: (_app, statusBar: IStatusBar | null) => {
    if (!statusBar || !serverSideHere()) {
      return;
    }
    const openedAt = Date.now() / 1000;
    const item = new Widget();
    item.addClass('jp-gpulab-CellsItem');
    item.node.setAttribute('data-gpulab', 'cells');
    const poll = new Poll({
      factory: async () => {
        const cells = await requestAPI<ICells>('cells');
        const text = cellsText(cells, openedAt);
        item.node.textContent = text;
        item.setHidden(text === '');
        item.node.title = cells.running.map(r => `${r.path ?? ''}`).join('\n');
      },
      frequency: { interval: 3000, backoff: true, max: 60_000 },
      name: 'gpulab:cells',
      standby: 'when-hidden'
    });
    statusBar.registerStatusItem('gpulab-jupyter:cells-status', {
      item,
      align: 'left',
      rank: 5,
      isActive: () => true
    });
    item.setHidden(true);
    void poll;
  }
};

export default cellsStatus;
