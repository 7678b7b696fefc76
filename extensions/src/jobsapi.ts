/**
 * The jobs and idle routes of the server extension (docs/jobs.md): what they
 * answer, and how to ask them to do something.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { API_PREFIX } from './api';

export type JobState = 'starting' | 'running' | 'succeeded' | 'failed' | 'stopped' | 'lost';

export const FINISHED: ReadonlyArray<string> = ['succeeded', 'failed', 'stopped', 'lost'];

export interface IJobRequest {
  target: string;
  args?: string[];
  gpus?: string;
  precision?: string;
  name?: string;
  /** Any command, run as it is (`-- bash train.sh`): then no target and no args. */
  command?: string[];
}

export interface IJob {
  id: string;
  state: JobState;
  started: number;
  ended: number | null;
  elapsed: number;
  exit_code: number | null;
  message: string;
  request: IJobRequest;
  argv: string[];
  /** The executed notebook (project-relative), for notebook jobs. */
  output: string;
  /** The supervisor's process id while it runs. */
  pid: number | null;
  /** What it runs as the user typed it after `gpulab-job run`, shell-quoted (`-- bash train.sh`). */
  command_line?: string;
  /** GET jobs/<id> only: the end of its output, terminal codes removed. */
  log_tail?: string;
}

/** GET activity: when the idle culler would stop this project. */
export interface IActivity {
  idle_timeout: number;
  last_activity: number;
  stop_at: number | null;
  kept_by: string[];
}

/** The server's words for a refused request, or the status line. */
async function reason(response: Response): Promise<string> {
  try {
    const body = (await response.json()) as { message?: unknown; reason?: unknown };
    for (const v of [body.message, body.reason]) {
      if (typeof v === 'string' && v) {
        return v;
      }
    }
  } catch (e) {
    // not JSON: the status says it
  }
  return `The server answered ${response.status} ${response.statusText}`.trim();
}

/** POST a route under /api/gpulab/v1/; rejects with the server's message. */
export async function postAPI<T>(endPoint: string, body: unknown = {}): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const url = URLExt.join(settings.baseUrl, API_PREFIX, endPoint);
  const init = { method: 'POST', body: JSON.stringify(body) };
  const response = await ServerConnection.makeRequest(url, init, settings);
  if (!response.ok) {
    throw new Error(await reason(response));
  }
  return (await response.json()) as T;
}

/** Characters a shell word may hold unquoted (Python's `shlex.quote`). */
const SAFE_WORD = /^[\w@%+=:,./-]+$/;

/** One word as a shell reads it back: `it's` → `'it'"'"'s'` (as Python's `shlex.quote`). */
export function shellQuote(word: string): string {
  if (!word) {
    return "''";
  }
  return SAFE_WORD.test(word) ? word : `'${word.replace(/'/g, `'"'"'`)}'`;
}

/** Words as a shell reads them back, each one itself (as Python's `shlex.join`). */
export function shellJoin(words: string[]): string {
  return words.map(shellQuote).join(' ');
}

/** A command job's command as typed (`bash train.sh`), quoted; '' for a script or notebook. */
export function commandText(job: IJob): string {
  const command = job.request.command || [];
  if (!command.length) {
    return '';
  }
  const line = job.command_line || '';
  return line.startsWith('-- ') ? line.slice(3) : line || shellJoin(command);
}

/** What the user calls a job: its name, else the command or the file it runs. */
export function jobTitle(job: IJob): string {
  return job.request.name || commandText(job) || job.request.target || job.id;
}

/** `45s`, `12m 03s`, `2h 05m`. */
export function duration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const pad = (n: number) => String(n).padStart(2, '0');
  if (s < 60) {
    return `${s}s`;
  }
  if (s < 3600) {
    return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  }
  return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
}

/**
 * Seconds it has run: the server's count, plus (while it runs) the seconds since
 * the server said it (`sinceAnswer`), so it ticks without trusting this clock.
 */
export function elapsed(job: IJob, sinceAnswer = 0): number {
  return FINISHED.includes(job.state) ? job.elapsed : job.elapsed + Math.max(0, sinceAnswer);
}

/** How it ended, for a notification: "Job train.py succeeded after 12m 03s". */
export function endText(job: IJob): string {
  const after = `after ${duration(elapsed(job))}`;
  const title = jobTitle(job);
  switch (job.state) {
    case 'succeeded':
      return `Job ${title} succeeded ${after}`;
    case 'failed':
      return job.exit_code === null
        ? `Job ${title} failed ${after}${job.message ? `: ${job.message}` : ''}`
        : `Job ${title} failed (exit code ${job.exit_code}) ${after}`;
    case 'stopped':
      return `Job ${title} was stopped ${after}`;
    default:
      return `Job ${title} was lost ${after}: ${job.message || 'the project stopped while it ran'}`;
  }
}

export function logPath(job: IJob): string {
  return `jobs/${job.id}/output.log`;
}
