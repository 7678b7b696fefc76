/**
 * Words and numbers shown to people: sizes in GiB, levels, the no-GPU explanations.
 */
import { IGpu, IStatus, Reason } from './api';

export interface IThresholds {
  memoryWarning: number;
  memoryCritical: number;
  temperatureWarning: number;
  temperatureCritical: number;
}

export const DEFAULT_THRESHOLDS: IThresholds = {
  memoryWarning: 80,
  memoryCritical: 95,
  temperatureWarning: 80,
  temperatureCritical: 90
};

export type Level = 'ok' | 'warning' | 'critical' | 'none';

/** Why the numbers on show are not current: a short cause, the details, since when. */
export interface IStale {
  short: string;
  detail: string;
  /** When the numbers on show were read (Unix seconds), or null if there are none. */
  numbersFrom: number | null;
  /** The server refused this person (HTTP 403): their access to the project ended. */
  noAccess?: boolean;
}

/** What the status bar says, and its hover text, when the server refuses this person. */
export const NO_ACCESS_TEXT = 'GPU — no access';
export const NO_ACCESS_TITLE = 'You no longer have access to this project';

const GIB = 1024 ** 3;

function num(x: number | null | undefined): x is number {
  return typeof x === 'number' && isFinite(x);
}

export function gib(bytes: number | null | undefined): string {
  if (!num(bytes)) {
    return '?';
  }
  const g = bytes / GIB;
  return g >= 100 ? g.toFixed(0) : g.toFixed(1);
}

export function memory(used?: number | null, total?: number | null): string {
  return `${gib(used)}/${gib(total)} GiB`;
}

export function percent(x: number | null | undefined): string {
  return num(x) ? `${Math.round(x)}%` : 'n/a';
}

export function watts(draw?: number | null, limit?: number | null): string {
  if (!num(draw)) {
    return 'n/a';
  }
  return num(limit) ? `${draw.toFixed(0)}/${limit.toFixed(0)} W` : `${draw.toFixed(0)} W`;
}

export function celsius(t?: number | null): string {
  return num(t) ? `${t} °C` : 'n/a';
}

function memoryPercent(g: IGpu): number | null {
  return num(g.memory_used) && num(g.memory_total) && g.memory_total > 0
    ? (100 * g.memory_used) / g.memory_total
    : null;
}

/** How worrying one GPU looks against the thresholds. */
export function gpuLevel(g: IGpu, t: IThresholds): Level {
  const mem = memoryPercent(g);
  const temp = g.temperature;
  if ((num(mem) && mem >= t.memoryCritical) || (num(temp) && temp >= t.temperatureCritical)) {
    return 'critical';
  }
  if ((num(mem) && mem >= t.memoryWarning) || (num(temp) && temp >= t.temperatureWarning)) {
    return 'warning';
  }
  return 'ok';
}

export function statusLevel(s: IStatus | null, t: IThresholds): Level {
  if (!s || !s.available || s.gpus.length === 0) {
    return 'none';
  }
  const levels = s.gpus.map(g => gpuLevel(g, t));
  return levels.includes('critical') ? 'critical' : levels.includes('warning') ? 'warning' : 'ok';
}

/** The status bar text: `GPU 43% · 12.1/80 GiB`, `4 GPUs 51% · 40.2/320 GiB` or `No GPU`. */
export function statusText(s: IStatus | null): string {
  if (!s) {
    return 'GPU …';
  }
  if (!s.available) {
    return s.reason === 'starting' ? 'GPU …' : 'No GPU';
  }
  const sum = s.summary;
  const label = sum.count === 1 ? 'GPU' : `${sum.count} GPUs`;
  return `${label} ${percent(sum.utilization)} · ${memory(sum.memory_used, sum.memory_total)}`;
}

export function gpuLine(g: IGpu): string {
  const kind = g.mig ? ' (MIG slice)' : '';
  return (
    `GPU ${g.index}: ${g.name}${kind} — ${percent(g.utilization)} busy, ` +
    `${memory(g.memory_used, g.memory_total)}, ${celsius(g.temperature)}, ` +
    `${watts(g.power_draw, g.power_limit)}`
  );
}

/** A Unix time as the clock on the wall shows it. */
export function clock(seconds: number): string {
  return new Date(seconds * 1000).toLocaleTimeString();
}

/** The status bar text when the numbers are not current: `GPU — stale (HTTP 500)`. */
export function staleText(stale: IStale): string {
  return stale.noAccess ? NO_ACCESS_TEXT : `GPU — stale (${stale.short})`;
}

/** The hover text when the numbers are not current: why, and the last ones, marked so. */
export function staleTitle(s: IStale, status: IStatus | null): string {
  if (s.noAccess) {
    return NO_ACCESS_TITLE;
  }
  const lines = [`GPU status is stale: ${s.detail}`];
  if (s.numbersFrom !== null && status) {
    lines.push(`Last known numbers, from ${clock(s.numbersFrom)}:`);
    lines.push(...status.gpus.map(gpuLine));
  } else {
    lines.push('No numbers to show.');
  }
  lines.push('Retrying; click to try now and for details.');
  return lines.join('\n');
}

/** The hover text of the status bar item. */
export function statusTitle(s: IStatus | null, error: string): string {
  if (error) {
    return `GPU status unavailable: ${error}`;
  }
  if (!s) {
    return 'GPU status: waiting for the server';
  }
  if (!s.available) {
    const hint = s.hint ? `\n${s.hint}` : '';
    return `No GPU: ${s.message}${hint}\nClick for details.`;
  }
  return s.gpus.map(gpuLine).join('\n') + '\nClick for the GPU panel.';
}

/**
 * A heading for each reason there is no GPU, and what to do when the server
 * (an older one) says nothing: the server's `hint` comes from the one diagnosis
 * that %gpu_info shares (gpulab_jupyter/diagnosis.py).
 */
export function noGpuExplanation(reason: Reason): { title: string; hint: string } {
  switch (reason) {
    case 'no_driver':
      return { title: 'No NVIDIA driver', hint: 'Your code runs on the CPU.' };
    case 'none_allocated':
      return {
        title: 'No GPU for this project',
        hint: 'Start the project again with a GPU.'
      };
    case 'nvml_error':
      return {
        title: 'NVML failed',
        hint: 'The NVIDIA management library reported an error; the server log has details.'
      };
    case 'sampler_error':
      return {
        title: 'The GPU sampler failed',
        hint:
          'Reading the GPUs failed; the server tries again, less often while it fails. ' +
          'The server log has details.'
      };
    default:
      return { title: 'GPU status is starting', hint: 'The first sample comes in a moment.' };
  }
}

/** The line shown while the project runs its last good image, and where its build log is. */
export function lastGoodText(note: string): string {
  return (
    note ||
    "Running the last image that built: the Dockerfile's latest build failed. " +
      'Fix the Dockerfile and restart the project.'
  );
}
