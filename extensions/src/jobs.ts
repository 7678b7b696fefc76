/**
 * The project's jobs as this tab knows them: one `@lumino/polling` Poll that
 * reads GET jobs (and, while the panel shows, GET jobs/<id> for their output), fast while
 * the Jobs panel is visible and a job runs, slowly otherwise, standing by while
 * the tab is hidden. A job seen running at one poll and ended at the next (or
 * started from this tab and already ended) is announced once on `ended`.
 */
import { IPoll, Poll } from '@lumino/polling';
import { ISignal, Signal } from '@lumino/signaling';

import { IProcesses, requestAPI } from './api';
import { FINISHED, IJob, IJobRequest, postAPI } from './jobsapi';
import { GpuModel } from './model';

/** Poll every 2 s while the panel shows a running job; every 15 s otherwise. */
const FAST_MS = 2000;
const SLOW_MS = 15000;
const MAX_BACKOFF_MS = 60000;
/** How many of the newest jobs the panel shows with their output. */
export const SHOWN = 20;

export class JobsModel {
  jobs: IJob[] = [];
  /** When the server last answered (ms, this clock): the elapsed times tick from it. */
  answeredAt = 0;
  /** The last request's error ('' when it worked). */
  error = '';
  /** Whether the first answer came. */
  loaded = false;
  /** The GPU processes (with their jobs) while the panel shows a running job; else null. */
  processes: IProcesses | null = null;

  /** ``gpu``: the GPU status the status bar polls (whether there is a GPU to ask about). */
  constructor(private _gpu: GpuModel | null = null) {
    this._poll = new Poll({
      auto: false,
      factory: () => this._tick(),
      frequency: this._frequency(),
      name: 'gpulab:jobs',
      standby: 'when-hidden'
    });
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** A job that ended while this tab watched it (once per job). */
  get ended(): ISignal<this, IJob> {
    return this._ended;
  }

  /** The job with its output (GET jobs/<id>), if fetched. */
  detail(id: string): IJob | undefined {
    return this._details.get(id);
  }

  get running(): boolean {
    return this.jobs.some(j => !FINISHED.includes(j.state));
  }

  /** The Jobs panel is on screen: poll fast while a job runs. */
  set visible(on: boolean) {
    this._visible = on;
    this._updateFrequency();
    if (on) {
      this.refresh();
    }
  }

  start(): void {
    void this._poll.start();
  }

  refresh(): Promise<void> {
    return this._poll.refresh();
  }

  dispose(): void {
    this._poll.dispose();
  }

  /** POST jobs: start one; rejects with the server's words. */
  async run(request: IJobRequest): Promise<IJob> {
    return this._started(await postAPI<IJob>('jobs', request));
  }

  async rerun(id: string): Promise<IJob> {
    return this._started(await postAPI<IJob>(`jobs/${id}/rerun`));
  }

  /** POST jobs/<id>/stop: answers once the job ended. */
  async stop(id: string): Promise<IJob> {
    this._stopping.add(id);
    this._announced.add(id); // the user stopped it: no notification about it
    this._changed.emit();
    try {
      const job = await postAPI<IJob>(`jobs/${id}/stop`);
      this._stopping.delete(id); // before it shows as stopped: never "stopping" after
      this._merge(job);
      return job;
    } finally {
      if (this._stopping.delete(id)) {
        this._changed.emit(); // refused: no longer stopping
      }
      void this.refresh();
    }
  }

  isStopping(id: string): boolean {
    return this._stopping.has(id);
  }

  private _started(job: IJob): IJob {
    this._watching.add(job.id);
    this._merge(job);
    void this.refresh();
    return job;
  }

  /** A job the server just answered about, into the list (newest first). */
  private _merge(job: IJob): void {
    const at = this.jobs.findIndex(j => j.id === job.id);
    if (at >= 0) {
      this.jobs[at] = { ...this.jobs[at], ...job };
    } else {
      this.jobs = [job, ...this.jobs].sort((a, b) => (a.id < b.id ? 1 : -1));
    }
    this._changed.emit();
  }

  private async _tick(): Promise<void> {
    try {
      const { jobs } = await requestAPI<{ jobs: IJob[] }>('jobs');
      // Their output only while the panel shows it (the list alone tells when one ends).
      const shown = this._visible ? jobs.slice(0, SHOWN) : [];
      await Promise.all(
        shown
          .filter(j => !FINISHED.includes(j.state) || !this._final.has(j.id))
          .map(async j => {
            const d = await requestAPI<IJob>(`jobs/${j.id}`);
            this._details.set(j.id, d);
            if (FINISHED.includes(d.state)) {
              this._final.add(j.id);
            }
          })
      );
      this.processes = await this._processes(jobs);
      this._announce(jobs);
      this.jobs = jobs;
      this.answeredAt = Date.now();
      this.error = '';
      this.loaded = true;
    } catch (reason) {
      this.error = reason instanceof Error ? reason.message : String(reason);
      this._changed.emit();
      throw reason; // the poll backs off
    }
    this._updateFrequency();
    this._changed.emit();
  }

  /** Which process runs for which job: asked only while it can be seen, and used. */
  private async _processes(jobs: IJob[]): Promise<IProcesses | null> {
    const running = jobs.some(j => j.state === 'running');
    if (!this._visible || !running || !this._gpu?.status?.available) {
      return null;
    }
    try {
      return await requestAPI<IProcesses>('gpu/processes');
    } catch (reason) {
      return null; // the project's GPU use is still shown
    }
  }

  /** Jobs that ended since the last answer: running then, or started here. */
  private _announce(jobs: IJob[]): void {
    const before = new Map(this.jobs.map(j => [j.id, j.state]));
    for (const job of jobs) {
      if (!FINISHED.includes(job.state) || this._announced.has(job.id)) {
        continue;
      }
      const was = before.get(job.id);
      const watched = this._watching.has(job.id);
      const seenRunning = this.loaded && was !== undefined && !FINISHED.includes(was);
      if (watched || seenRunning) {
        this._announced.add(job.id);
        this._watching.delete(job.id);
        this._ended.emit(this._details.get(job.id) || job);
      }
    }
  }

  private _frequency(): IPoll.Frequency {
    const interval = this._visible && this.running ? FAST_MS : SLOW_MS;
    return { interval, backoff: true, max: Math.max(MAX_BACKOFF_MS, interval) };
  }

  private _updateFrequency(): void {
    if (this._poll) {
      this._poll.frequency = this._frequency();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _ended = new Signal<this, IJob>(this);
  private _poll: Poll;
  private _visible = false;
  private _details = new Map<string, IJob>();
  private _final = new Set<string>();
  private _watching = new Set<string>();
  private _announced = new Set<string>();
  private _stopping = new Set<string>();
}
