/**
 * The server side's JSON (documented in docs/gpu-status-api.md) and how to ask for it.
 */
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export const API_PREFIX = 'api/gpulab/v1';

/** Why there is no GPU: 'no_driver', 'none_allocated', 'nvml_error', 'sampler_error' or 'starting'. */
export type Reason =
  | 'no_driver'
  | 'none_allocated'
  | 'nvml_error'
  | 'sampler_error'
  | 'starting'
  | null;

export interface IGpu {
  index: number;
  uuid: string;
  name: string;
  nvml_index: string;
  mig: boolean;
  parent_uuid: string | null;
  utilization?: number | null;
  memory_utilization?: number | null;
  memory_used?: number | null;
  memory_total?: number | null;
  memory_free?: number | null;
  temperature?: number | null;
  power_draw?: number | null;
  power_limit?: number | null;
  pcie_tx?: number | null;
  pcie_rx?: number | null;
  energy?: number | null;
}

export interface ISummary {
  count: number;
  utilization: number | null;
  memory_used: number | null;
  memory_total: number | null;
}

interface ICommon {
  available: boolean;
  reason: Reason;
  message: string;
  /** What the user can do about having no GPU ('' when there is one). */
  hint?: string;
  interval: number;
  min_interval: number;
  process_interval: number;
  history_seconds: number;
  /** The sampler's last round failed (or it stopped): what is here is not current. */
  stale: boolean;
  /** That failure, in words; null when the last round worked. */
  error: string | null;
  /** When the failures began (Unix seconds). */
  error_since: number | null;
  /** When a round last worked (Unix seconds); null if none has yet. */
  last_ok: number | null;
}

/** How this container's GPU is shared: on WSL2 every GPU project shares it, unmeasured. */
export interface ISharing {
  mode: 'wsl2-shared';
  /** "shared GPU (WSL2) — utilisation not available" */
  words: string;
}

export interface IStatus extends ICommon {
  timestamp: number;
  driver_version?: string;
  gpus: IGpu[];
  summary: ISummary;
  /** null (or absent) where the container has GPUs of its own. */
  sharing?: ISharing | null;
}

export type Series = (number | null)[];

export interface IHistory extends ICommon {
  timestamps: number[];
  gpus: {
    [uuid: string]: {
      utilization: Series;
      memory_used: Series;
      temperature: Series;
      power_draw: Series;
    };
  };
}

export interface IKernel {
  id: string;
  name: string;
  path: string | null;
  session: string | null;
  type?: string;
}

export interface IProcessGpu {
  uuid: string;
  index: number | null;
  memory_used: number | null;
  match: 'pid' | 'order' | null;
}

export interface IProcess {
  pid: number;
  driver_pid?: number;
  name: string;
  command: string;
  kernel: IKernel | null;
  /** The running job it belongs to (its id), or null. */
  job?: string | null;
  gpus: IProcessGpu[];
}

export interface IOther {
  uuid: string;
  index: number | null;
  count: number;
  memory_used: number | null;
}

export interface IProcesses {
  available: boolean;
  stale: boolean;
  error: string | null;
  timestamp: number | null;
  processes: IProcess[];
  other: IOther[];
}

/** Which image the project runs: its Dockerfile's latest build, or the last one that built. */
export interface IImageState {
  state: 'latest' | 'last-good';
  /** One line for the user (from the hub). */
  note: string;
  /** The hub's page with the failed build's log (a path on the hub), or ''. */
  build_log_url: string;
}

/** GET info: the project this server serves, and what a refusal tells this person. */
export interface IInfo {
  version: string;
  project: string;
  /** What people call the project ("Alice First"); the project's id without one; '' outside gpulab. */
  display_name: string;
  owner: string;
  workspace: string;
  image: string;
  image_state: IImageState;
  /** What the server tells this person when it refuses a change ('' for those who may). */
  refusal: string;
}

let info: Promise<IInfo> | null = null;

/** The server's `info`, asked once per page (the image and the person do not change). */
export function fetchInfo(): Promise<IInfo> {
  if (!info) {
    info = requestAPI<IInfo>('info');
    info.catch(() => {
      info = null; // asked again next time
    });
  }
  return info;
}

/** GET a route under /api/gpulab/v1/ of this server, with the page's credentials. */
export async function requestAPI<T>(
  endPoint: string,
  query: { [key: string]: string | number } = {}
): Promise<T> {
  const settings = ServerConnection.makeSettings();
  const params = Object.keys(query)
    .map(k => `${encodeURIComponent(k)}=${encodeURIComponent(String(query[k]))}`)
    .join('&');
  const url =
    URLExt.join(settings.baseUrl, API_PREFIX, endPoint) + (params ? `?${params}` : '');
  const response = await ServerConnection.makeRequest(url, {}, settings);
  if (!response.ok) {
    throw new ServerConnection.ResponseError(response, `${response.status} ${url}`);
  }
  return (await response.json()) as T;
}
