/**
 * The Jobs panel (left sidebar): the project's jobs, newest first, each with its
 * state, elapsed time (ticking while it runs), what it runs, the last lines of
 * its output, its GPU use while it runs, and Stop / Re-run / Open log / Open
 * executed notebook. Its header says when a job, a running cell or GPU use keeps an idle
 * project running.
 */
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { IProcess } from './api';
import { gib, statusText } from './format';
import { IdleWatch, keptDetail, keptText } from './idle';
import { JobsModel, SHOWN } from './jobs';
import {
  FINISHED,
  IJob,
  commandText,
  duration,
  elapsed,
  jobTitle,
  shellJoin
} from './jobsapi';
import { GpuModel } from './model';

/** How many lines of a job's output the panel shows. */
const TAIL_LINES = 8;

export interface IJobsPanelOptions {
  jobs: JobsModel;
  idle: IdleWatch;
  gpu: GpuModel | null;
  /** Whether this person may start and stop jobs (viewers may not). */
  canRun: () => boolean;
  openLog: (job: IJob) => void;
  openNotebook: (job: IJob) => void;
  /** Stop or re-run; shows the server's words if it refuses. */
  act: (action: 'stop' | 'rerun', job: IJob) => void;
}

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

function button(label: string, gpulab: string, onClick: () => void): HTMLButtonElement {
  const b = el('button', 'jp-gpulab-JobButton jp-mod-styled', label);
  b.type = 'button';
  b.dataset.gpulab = gpulab;
  b.addEventListener('click', onClick);
  return b;
}

/** The last lines of ``text`` (the log's first line may be cut in two: dropped). */
export function lastLines(text: string, n: number): string {
  const lines = text.replace(/\r/g, '\n').split('\n');
  while (lines.length && !lines[lines.length - 1].trim()) {
    lines.pop();
  }
  return lines.filter(l => l.trim()).slice(-n).join('\n');
}

/** What runs, with the interpreter by its name (`python3 -u train.py`), not its path; quoted. */
export function shortCommand(argv: string[]): string {
  if (!argv.length) {
    return '';
  }
  const program = argv[0].split('/').pop() || argv[0];
  return shellJoin([program, ...argv.slice(1)]);
}

/** "GPU 0: 11.2 GiB in 1 process" for a job's processes ('' when none holds a GPU). */
export function jobGpuText(procs: IProcess[]): string {
  const byGpu = new Map<string, number | null>();
  for (const p of procs) {
    for (const g of p.gpus) {
      const key = g.index === null ? '?' : String(g.index);
      const had = byGpu.has(key) ? byGpu.get(key)! : 0;
      byGpu.set(key, had === null || g.memory_used === null ? null : had + g.memory_used);
    }
  }
  if (!byGpu.size) {
    return '';
  }
  const parts = [...byGpu.entries()].map(
    ([index, used]) => `GPU ${index}: ${used === null ? 'memory unknown' : `${gib(used)} GiB`}`
  );
  const n = procs.length;
  return `${parts.join(', ')} in ${n} process${n === 1 ? '' : 'es'}`;
}

export class JobsPanel extends Widget {
  constructor(private options: IJobsPanelOptions) {
    super();
    this.addClass('jp-gpulab-JobsPanel');
    this.node.dataset.gpulab = 'jobs-panel';
    this.title.caption = 'Jobs: scripts and notebooks that run on without the browser';
    this._clock = new Poll({
      auto: false,
      factory: async () => this._tickClock(),
      frequency: { interval: 1000, backoff: false },
      name: 'gpulab:jobs-clock',
      standby: 'when-hidden'
    });
    options.jobs.changed.connect(this.render, this);
    options.idle.changed.connect(this.render, this);
    options.gpu?.changed.connect(this._renderGpu, this);
    this.render();
  }

  /** The job to show first and highlight (the one just started). */
  set focusJob(id: string) {
    this._focus = id;
    this.render();
    this.node.querySelector(`[data-job-id="${id}"]`)?.scrollIntoView({ block: 'nearest' });
  }

  protected onAfterShow(): void {
    this.options.jobs.visible = true;
    void this._clock.start();
  }

  protected onBeforeHide(): void {
    this.options.jobs.visible = false;
    void this._clock.stop();
  }

  protected onAfterAttach(): void {
    if (this.isVisible) {
      this.onAfterShow();
    }
  }

  protected onBeforeDetach(): void {
    this.onBeforeHide();
  }

  dispose(): void {
    this.options.jobs.changed.disconnect(this.render, this);
    this.options.idle.changed.disconnect(this.render, this);
    this.options.gpu?.changed.disconnect(this._renderGpu, this);
    this._clock.dispose();
    super.dispose();
  }

  render(): void {
    const { jobs } = this.options;
    const body = el('div', 'jp-gpulab-JobsBody');
    const head = el('div', 'jp-gpulab-JobsHead');
    head.appendChild(el('h2', '', 'Jobs'));
    const activity = this.options.idle.activity;
    const kept = keptText(activity, jobs.running);
    if (kept && activity) {
      const line = el('p', 'jp-gpulab-JobsKept', kept);
      line.dataset.gpulab = 'jobs-kept';
      line.title = keptDetail(activity);
      head.appendChild(line);
    }
    body.appendChild(head);
    if (jobs.error) {
      const line = el('p', 'jp-gpulab-Error', `Could not read the jobs: ${jobs.error}. Retrying.`);
      line.dataset.gpulab = 'jobs-error';
      body.appendChild(line);
    }
    if (!jobs.loaded) {
      body.appendChild(el('p', 'jp-gpulab-Empty', 'Reading the jobs…'));
    } else if (!jobs.jobs.length) {
      const how = this.options.canRun()
        ? 'No jobs yet. Right-click a .py or .ipynb file in the file browser and choose ' +
          'Run as job, or use Run as job in a notebook: it runs on with the browser closed.'
        : 'No jobs in this project.';
      body.appendChild(el('p', 'jp-gpulab-Empty', how));
    }
    const list = el('ul', 'jp-gpulab-JobList');
    for (const job of jobs.jobs.slice(0, SHOWN)) {
      list.appendChild(this._renderJob(jobs.detail(job.id) || job, job));
    }
    body.appendChild(list);
    if (jobs.jobs.length > SHOWN) {
      body.appendChild(
        el('p', 'jp-gpulab-Footer', `${jobs.jobs.length - SHOWN} older jobs are in jobs/.`)
      );
    }
    this.node.replaceChildren(body);
    this._renderGpu();
  }

  /** A job; ``detail`` has its output, ``job`` the newest state from the list. */
  private _renderJob(detail: IJob, job: IJob): HTMLElement {
    const { jobs, canRun } = this.options;
    const state = job.state;
    const running = !FINISHED.includes(state);
    const item = el('li', `jp-gpulab-Job jp-gpulab-Job-${state}`);
    item.dataset.jobId = job.id;
    item.dataset.state = state;
    if (job.id === this._focus) {
      item.classList.add('jp-mod-focus');
    }
    const top = el('div', 'jp-gpulab-JobTop');
    // A poll may bring the ended state before the stop request answers: ended wins.
    const shown = running && jobs.isStopping(job.id) ? 'stopping' : state;
    const badge = el('span', 'jp-gpulab-JobState', shown);
    badge.dataset.gpulab = 'job-state';
    top.appendChild(badge);
    const title = el('span', 'jp-gpulab-JobTitle', jobTitle(job));
    title.dataset.gpulab = 'job-title';
    if (commandText(job) && !job.request.name) {
      title.classList.add('jp-mod-command'); // shown whole: every word counts
    }
    title.title = `Job ${job.id}`;
    top.appendChild(title);
    const time = el('span', 'jp-gpulab-JobElapsed', duration(elapsed(job, this._since())));
    time.dataset.gpulab = 'job-elapsed';
    time.title = `Started ${new Date(job.started * 1000).toLocaleString()}`;
    top.appendChild(time);
    item.appendChild(top);

    // A command job runs its words as typed (quoted as a shell reads them back);
    // a script or notebook, the interpreter's command line that gpulab made.
    const typed = commandText(job);
    const runs = typed || shortCommand(job.argv || []) || job.request.target;
    const cmd = el('div', 'jp-gpulab-JobCommand', runs);
    cmd.dataset.gpulab = 'job-command';
    cmd.title = typed ? `gpulab-job run ${job.command_line}` : shellJoin(job.argv || []);
    // A command job without a name has its command as its title already.
    cmd.hidden = !!typed && !job.request.name;
    item.appendChild(cmd);
    const end = this._endLine(job);
    if (end) {
      item.appendChild(el('div', 'jp-gpulab-JobMessage', end));
    }
    if (running) {
      const gpu = el('div', 'jp-gpulab-JobGpu');
      gpu.dataset.gpulab = 'job-gpu';
      item.appendChild(gpu);
    }
    const tail = lastLines(detail.log_tail || '', TAIL_LINES);
    const pre = el('pre', 'jp-gpulab-JobTail', tail || (running ? 'No output yet.' : 'No output.'));
    pre.dataset.gpulab = 'job-output';
    item.appendChild(pre);

    const actions = el('div', 'jp-gpulab-JobActions');
    if (canRun() && running) {
      const stop = button('Stop', 'job-stop', () => this.options.act('stop', job));
      stop.disabled = jobs.isStopping(job.id);
      actions.appendChild(stop);
    }
    if (canRun() && !running) {
      actions.appendChild(button('Re-run', 'job-rerun', () => this.options.act('rerun', job)));
    }
    actions.appendChild(button('Open log', 'job-log', () => this.options.openLog(job)));
    if (job.output && !running) {
      actions.appendChild(
        button('Open executed notebook', 'job-notebook', () => this.options.openNotebook(job))
      );
    }
    item.appendChild(actions);
    return item;
  }

  private _endLine(job: IJob): string {
    switch (job.state) {
      case 'failed':
        return job.exit_code === null
          ? `Failed${job.message ? `: ${job.message}` : ''}`
          : `Failed with exit code ${job.exit_code}`;
      case 'lost':
        return `Lost: ${job.message}`;
      case 'stopped':
        return job.message ? job.message[0].toUpperCase() + job.message.slice(1) : 'Stopped';
      default:
        return '';
    }
  }

  /**
   * On each running job: its processes' GPU memory where the server names the
   * job's processes, and the project's GPU use (the status the status bar reads).
   */
  private _renderGpu(): void {
    const status = this.options.gpu?.status;
    let project = '';
    if (status && status.available) {
      project = `GPU use of the project: ${statusText(status)}`;
    } else if (status) {
      project = 'No GPU in this project: it runs on the CPU.';
    }
    const procs = this.options.jobs.processes?.processes || [];
    this.node.querySelectorAll<HTMLElement>('[data-gpulab=job-gpu]').forEach(node => {
      const id = node.closest<HTMLElement>('[data-job-id]')?.dataset.jobId;
      const own = jobGpuText(procs.filter(p => p.job && p.job === id));
      node.textContent = [own, project].filter(t => t).join(' · ');
      node.hidden = !node.textContent;
    });
  }

  private _since(): number {
    const at = this.options.jobs.answeredAt;
    return at ? (Date.now() - at) / 1000 : 0;
  }

  /** Elapsed times tick every second while the panel shows. */
  private _tickClock(): void {
    const since = this._since();
    for (const job of this.options.jobs.jobs.slice(0, SHOWN)) {
      if (FINISHED.includes(job.state)) {
        continue;
      }
      const node = this.node.querySelector(`[data-job-id="${job.id}"] [data-gpulab=job-elapsed]`);
      if (node) {
        node.textContent = duration(elapsed(job, since));
      }
    }
  }

  private _clock: Poll;
  private _focus = '';
}
