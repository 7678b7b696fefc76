/**
 * Idle projects stop by themselves (docs/jobs.md): this tab reads GET activity
 * and, when the project would stop soon and nothing keeps it (no job, no GPU
 * use), shows a notification with "Keep it running" (POST activity/keep). The
 * poll runs on while the tab is hidden (the GET does not count as activity), so
 * a tab left in the background tells its user on coming back.
 */
import { Notification } from '@jupyterlab/apputils';
import { Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { requestAPI } from './api';
import { IActivity, postAPI } from './jobsapi';

/** What keeps a project running beyond its last use (re-marked while it lasts). */
const KEEPERS: { [key: string]: string } = {
  job: 'a job is running',
  gpu: 'a GPU is in use',
  cell: 'a cell is running'
};

/** Seconds before the stop at which the notice shows: 15 minutes, or half a short timeout. */
export function noticeWindow(timeout: number): number {
  return Math.min(15 * 60, timeout / 2);
}

/** Seconds between reads of GET activity: a minute, less for short timeouts. */
export function pollSeconds(timeout: number): number {
  return timeout > 0 ? Math.max(5, Math.min(60, timeout / 4)) : 300;
}

/** "14:05" in this browser's time. */
function hhmm(seconds: number): string {
  const d = new Date(seconds * 1000);
  return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', hour12: false });
}

/** The notice's words when it is due, or '' (pure, for the panel and the notice). */
export function idleNotice(a: IActivity | null, now: number): string {
  if (!a || a.idle_timeout <= 0 || a.stop_at === null) {
    return '';
  }
  // A running job or a busy GPU is counted as activity every few seconds, so it
  // keeps stop_at beyond the window by itself: stop_at is the whole truth.
  if (a.stop_at - now > noticeWindow(a.idle_timeout)) {
    return '';
  }
  return (
    `This project stops at ${hhmm(a.stop_at)} if it stays idle ` +
    '(no browser activity, job, running cell or GPU use), and its GPUs go to others. Your files stay.'
  );
}

/** "45 minutes", "1 hour", "30 seconds": an idle timeout in words. */
export function spanText(seconds: number): string {
  const s = Math.round(seconds);
  const unit = (n: number, word: string) => `${n} ${word}${n === 1 ? '' : 's'}`;
  if (s % 3600 === 0) {
    return unit(s / 3600, 'hour');
  }
  return s % 60 === 0 ? unit(s / 60, 'minute') : unit(s, 'second');
}

/**
 * What keeps a project running that would otherwise stop when idle, and what that
 * means: "A job is running, so this project is not stopped for being idle."
 * ``jobRunning``: whether a job runs now, as the jobs list says (the server's
 * ``job`` lasts two minutes after a job ended). '' when nothing keeps it.
 */
export function keptText(a: IActivity | null, jobRunning: boolean): string {
  if (!a || a.idle_timeout <= 0) {
    return '';
  }
  const by = [];
  if (jobRunning) {
    by.push(KEEPERS.job);
  }
  if (a.kept_by.includes('gpu')) {
    by.push(KEEPERS.gpu);
  }
  if (a.kept_by.includes('cell')) {
    by.push(KEEPERS.cell);
  }
  if (!by.length) {
    return '';
  }
  const why = by.join(' and ');
  return `${why[0].toUpperCase()}${why.slice(1)}, so this project is not stopped for being idle.`;
}

/** The longer words of keptText (its tooltip): what happens once nothing keeps it. */
export function keptDetail(a: IActivity): string {
  return (
    `Once nothing keeps it, the project stops after ${spanText(a.idle_timeout)} with no ` +
    'browser activity, job, running cell or GPU use, and its GPUs go to others. Your files stay.'
  );
}

export class IdleWatch {
  activity: IActivity | null = null;

  constructor() {
    this._poll = new Poll({
      auto: false,
      factory: () => this._tick(),
      frequency: { interval: pollSeconds(0) * 1000, backoff: true, max: 600 * 1000 },
      name: 'gpulab:activity',
      standby: 'never'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  start(): void {
    void this._poll.start();
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  /** POST activity/keep: the project has its whole timeout again. */
  async keep(): Promise<void> {
    try {
      this._apply(await postAPI<IActivity>('activity/keep'));
    } catch (reason) {
      Notification.error(`The project could not be kept running: ${String(reason)}`, {
        autoClose: 10000
      });
    }
  }

  dispose(): void {
    this._poll.dispose();
    this._dismiss();
  }

  private async _tick(): Promise<void> {
    this._apply(await requestAPI<IActivity>('activity'));
  }

  private _apply(a: IActivity): void {
    this.activity = a;
    const interval = pollSeconds(a.idle_timeout) * 1000;
    if (this._poll.frequency.interval !== interval) {
      this._poll.frequency = { interval, backoff: true, max: 600 * 1000 };
    }
    const text = idleNotice(a, Date.now() / 1000);
    if (text !== this._text) {
      this._dismiss();
      this._text = text;
      if (text) {
        this._id = Notification.warning(text, {
          autoClose: false,
          actions: [
            {
              label: 'Keep it running',
              caption: 'Count as activity now: the project gets its whole idle time again',
              displayType: 'accent',
              callback: () => void this.keep()
            }
          ]
        });
      }
    }
    this._changed.emit();
  }

  private _dismiss(): void {
    if (this._id) {
      Notification.dismiss(this._id);
      this._id = '';
    }
  }

  private _changed = new Signal<this, void>(this);
  private _poll: Poll;
  private _text = '';
  private _id = '';
}
