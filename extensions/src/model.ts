/**
 * One poller per browser tab: the status for the status bar, and (while the
 * panel is open) the history and the process list. The server keeps the
 * history, so an opened panel starts with full sparklines. Polling is a
 * `@lumino/polling` Poll: it backs off while the server fails to answer and
 * stands by while the tab is hidden.
 */
import { ServerConnection } from '@jupyterlab/services';
import { IPoll, Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { IHistory, IImageState, IProcesses, IStatus, fetchInfo, requestAPI } from './api';
import { IStale, NO_ACCESS_TITLE } from './format';

/** The longest wait between polls while the server does not answer (ms). */
const MAX_BACKOFF = 60 * 1000;

export class GpuModel {
  status: IStatus | null = null;
  history: IHistory | null = null;
  processes: IProcesses | null = null;
  /** Which image the project runs (asked once); null until the server said. */
  image: IImageState | null = null;
  /** The last request's error ('' when it worked). */
  error = '';
  /** The last request's error in a word or two: `HTTP 500`, `no answer`. */
  errorShort = '';

  constructor() {
    // Backs off (up to a minute) while requests fail; stands by while the tab is hidden.
    this._poll = new Poll({
      auto: false,
      factory: () => this._tick(),
      frequency: this._frequency(),
      name: 'gpulab:gpu-status',
      standby: 'when-hidden'
    });
    // Back in view: fresh numbers at once rather than at the next tick.
    document.addEventListener('visibilitychange', this._onVisibility);
  }

  /** Seconds between polls as set in the settings; the server's minimum still applies. */
  get refreshInterval(): number {
    return this._refreshInterval;
  }

  set refreshInterval(seconds: number) {
    this._refreshInterval = seconds;
    this._updateFrequency();
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get pollSeconds(): number {
    const floor = this.status ? this.status.min_interval : 0.5;
    return Math.max(this.refreshInterval, floor);
  }

  /**
   * Whether what is on show is not current, and why: the server did not answer,
   * or it answered that its sampler failed (its last numbers, marked stale).
   */
  get stale(): IStale | null {
    const numbersFrom = this.status && this.status.gpus.length ? this.status.timestamp : null;
    if (this.error && this.errorShort === 'HTTP 403') {
      // Refused, not unreachable: this person's access to the project ended.
      return { short: 'no access', detail: NO_ACCESS_TITLE, numbersFrom: null, noAccess: true };
    }
    if (this.error) {
      const detail = `The server did not answer: ${this.error}`;
      return { short: this.errorShort, detail, numbersFrom };
    }
    const s = this.status;
    if (s && s.stale) {
      const stopped = (s.error || '').startsWith('The GPU sampler stopped');
      const short = stopped ? 'sampler stopped' : 'sampler error';
      const detail = `The server's GPU sampler failed: ${s.error || 'unknown error'}`;
      return { short, detail, numbersFrom };
    }
    return null;
  }

  start(): void {
    void this._poll.start();
    fetchInfo()
      .then(info => {
        this.image = info.image_state;
        this._changed.emit();
      })
      .catch(reason => console.warn('gpulab-jupyter: no project info', reason));
  }

  dispose(): void {
    document.removeEventListener('visibilitychange', this._onVisibility);
    this._poll.dispose();
  }

  /** The panel is open: also fetch history and processes. */
  set detailed(on: boolean) {
    if (on && !this._detailed) {
      this.history = null;
      this._nextProcesses = 0;
    }
    this._detailed = on;
    if (on) {
      this.refreshNow();
    }
  }

  refreshNow(): void {
    void this._poll.refresh();
  }

  /** One poll: the status (and details). A failure is shown, then rejected: the poll backs off. */
  private async _tick(): Promise<void> {
    try {
      await this._fetch();
      this.error = '';
      this.errorShort = '';
    } catch (reason) {
      this.error = reason instanceof Error ? reason.message : String(reason);
      this.errorShort =
        reason instanceof ServerConnection.ResponseError
          ? `HTTP ${reason.response.status}`
          : 'no answer';
      this._changed.emit();
      throw reason;
    }
    this._updateFrequency();
    this._changed.emit();
  }

  private _frequency(): IPoll.Frequency {
    const interval = Math.round(this.pollSeconds * 1000);
    return { interval, backoff: true, max: Math.max(MAX_BACKOFF, interval) };
  }

  private _updateFrequency(): void {
    if (this._poll) {
      this._poll.frequency = this._frequency(); // the same frequency changes nothing
    }
  }

  private _onVisibility = (): void => {
    if (document.visibilityState === 'visible') {
      this.refreshNow();
    }
  };

  private async _fetch(): Promise<void> {
    this.status = await requestAPI<IStatus>('gpu', { interval: this.refreshInterval });
    if (!this._detailed || !this.status.available) {
      return;
    }
    await this._pollHistory();
    const now = Date.now() / 1000;
    if (now >= this._nextProcesses) {
      this.processes = await requestAPI<IProcesses>('gpu/processes');
      this._nextProcesses = now + Math.max(this.status.process_interval, this.pollSeconds);
    }
  }

  private async _pollHistory(): Promise<void> {
    const old = this.history;
    const last = old && old.timestamps.length ? old.timestamps[old.timestamps.length - 1] : 0;
    const fresh = await requestAPI<IHistory>('gpu/history', last ? { since: last } : {});
    if (!old || !last) {
      this.history = fresh;
      return;
    }
    const keepFrom = fresh.timestamps.length
      ? fresh.timestamps[fresh.timestamps.length - 1] - fresh.history_seconds
      : 0;
    const start = old.timestamps.findIndex(t => t >= keepFrom);
    const from = start < 0 ? old.timestamps.length : start;
    const merged: IHistory = { ...fresh, timestamps: [], gpus: {} };
    merged.timestamps = old.timestamps.slice(from).concat(fresh.timestamps);
    for (const uuid of Object.keys(fresh.gpus)) {
      const before = old.gpus[uuid];
      const after = fresh.gpus[uuid];
      const cut = (key: keyof typeof after) =>
        (before ? before[key].slice(from) : old.timestamps.slice(from).map(() => null)).concat(
          after[key]
        );
      merged.gpus[uuid] = {
        utilization: cut('utilization'),
        memory_used: cut('memory_used'),
        temperature: cut('temperature'),
        power_draw: cut('power_draw')
      };
    }
    this.history = merged;
  }

  private _changed = new Signal<this, void>(this);
  private _poll: Poll;
  private _refreshInterval = 2;
  private _detailed = false;
  private _nextProcesses = 0;
}
