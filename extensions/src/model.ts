/**
 * One poller per browser tab: the status for the status bar, and (while the
 * panel is open) the history and the process list. The server keeps the
 * history, so an opened panel starts with full sparklines.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { IHistory, IProcesses, IStatus, requestAPI } from './api';

export class GpuModel {
  status: IStatus | null = null;
  history: IHistory | null = null;
  processes: IProcesses | null = null;
  error = '';

  /** Seconds between polls as set in the settings; the server's minimum still applies. */
  refreshInterval = 2;

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get pollSeconds(): number {
    const floor = this.status ? this.status.min_interval : 0.5;
    return Math.max(this.refreshInterval, floor);
  }

  start(): void {
    if (!this._running) {
      this._running = true;
      void this._loop();
    }
  }

  dispose(): void {
    this._running = false;
    window.clearTimeout(this._timer);
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
    window.clearTimeout(this._timer);
    void this._loop();
  }

  private async _loop(): Promise<void> {
    if (this._busy) {
      return;
    }
    this._busy = true;
    try {
      await this._poll();
      this.error = '';
    } catch (reason) {
      this.error = reason instanceof Error ? reason.message : String(reason);
    } finally {
      this._busy = false;
    }
    this._changed.emit();
    if (this._running) {
      window.clearTimeout(this._timer);
      this._timer = window.setTimeout(() => void this._loop(), this.pollSeconds * 1000);
    }
  }

  private async _poll(): Promise<void> {
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
  private _running = false;
  private _busy = false;
  private _detailed = false;
  private _timer = 0;
  private _nextProcesses = 0;
}
