/**
 * The hub's warning that this project stops unless used (docs/gpus.md, "Idle GPUs come
 * back"): someone waits for its GPU, or it has been idle too long. The GPU status this
 * tab polls carries it (``reclaim``, which the server asks of the hub); this shows it
 * once per warning as a notification with "Keep it running", and says so when the
 * warning is withdrawn (the project was used, or nobody waits any more).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import { postAPI } from './jobsapi';
import { GpuModel } from './model';
import { IGpuStatus } from './tokens';

/** The status's ``reclaim``: set while the project is warned. */
export interface IReclaim {
  reason: 'waiting' | 'idle';
  stops_at: number;
  words: string;
}

export const WITHDRAWN = 'The GPU warning was withdrawn: this project keeps running.';

/** The warning in a status answer, or null (anything unexpected reads as none). */
export function reclaimOf(status: unknown): IReclaim | null {
  const r = (status as { reclaim?: unknown } | null)?.reclaim as IReclaim | null | undefined;
  if (!r || typeof r.words !== 'string' || !r.words || typeof r.stops_at !== 'number') {
    return null;
  }
  return r;
}

/** One notification per warning (a warning is known by when it stops the project). */
export class ReclaimNotice {
  constructor(private _keep: () => Promise<unknown>) {}

  /** What the status says now. */
  update(r: IReclaim | null): void {
    if (r && r.stops_at === this._stopsAt) {
      return;
    }
    if (this._id !== null) {
      Notification.dismiss(this._id);
      this._id = null;
    }
    if (r) {
      this._stopsAt = r.stops_at;
      const words = r.words.charAt(0).toUpperCase() + r.words.slice(1);
      this._id = Notification.warning(words, {
        autoClose: false,
        actions: [
          {
            label: 'Keep it running',
            caption: 'Counts as use now: the project is not stopped for being idle',
            callback: () => void this._keep().catch(() => undefined)
          }
        ]
      });
    } else if (this._stopsAt !== null) {
      this._stopsAt = null;
      Notification.info(WITHDRAWN, { autoClose: 8000 });
    }
  }

  private _id: string | null = null;
  private _stopsAt: number | null = null;
}

const reclaimWarning: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:reclaim-warning',
  description: "Says when the hub will stop this project's idle GPU unless it is used.",
  autoStart: true,
  requires: [IGpuStatus],
  activate: (_app: JupyterFrontEnd, model: GpuModel) => {
    const notice = new ReclaimNotice(() => postAPI('activity/keep'));
    model.changed.connect(() => notice.update(reclaimOf(model.status)));
  }
};

export default reclaimWarning;
