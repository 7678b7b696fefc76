/**
 * Where this JupyterLab runs: which hub, whose project, who is looking, and
 * what the server lets them do. Outside JupyterHub every field is empty and
 * nothing here throws.
 */
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

export interface IHubContext {
  /** The hub's URL prefix ('/hub/'), or '' outside JupyterHub. */
  hubPrefix: string;
  /** The logged-in user. */
  user: string;
  /** The project's owner (the server's user). */
  owner: string;
  /** The project (the named server). */
  project: string;
}

/** What the server's authorizer allows the logged-in user here. */
export interface IPermissions {
  read: boolean;
  write: boolean;
  run: boolean;
}

export const ALL_ALLOWED: IPermissions = { read: true, write: true, run: true };

export function hubContext(): IHubContext {
  return {
    hubPrefix: PageConfig.getOption('hubPrefix'),
    user: PageConfig.getOption('hubUser'),
    owner: PageConfig.getOption('hubServerUser'),
    project: PageConfig.getOption('hubServerName')
  };
}

/** Under JupyterHub, in a project (a named server): sharing applies. */
export function inProject(hub: IHubContext): boolean {
  return !!(hub.hubPrefix && hub.owner && hub.project);
}

/** The hub's share page for this project, without its navigation bar. */
export function shareUrl(hub: IHubContext): string {
  // The owner's own page, or (where the owner allows it) a collaborator's re-share page.
  const where = [hub.owner, hub.project].map(encodeURIComponent).join('/');
  return URLExt.join(hub.hubPrefix, 'gpulab/share', where) + '?embed=1';
}

/** The hub's "save a copy" page for one file of this project. */
export function copyUrl(hub: IHubContext, path: string): string {
  const query = URLExt.objectToQueryString({
    owner: hub.owner,
    project: hub.project,
    path
  });
  return URLExt.join(hub.hubPrefix, 'gpulab/copy') + query;
}

/**
 * Ask jupyter_server's /api/me what its authorizer allows: reading and
 * writing files, running kernels. On any failure, assume everything is
 * allowed (the server still refuses what it refuses).
 */
export async function fetchPermissions(
  settings: ServerConnection.ISettings = ServerConnection.makeSettings()
): Promise<IPermissions> {
  const asked = { contents: ['read', 'write'], kernels: ['execute'] };
  const url =
    URLExt.join(settings.baseUrl, 'api/me') +
    URLExt.objectToQueryString({ permissions: JSON.stringify(asked) });
  try {
    const response = await ServerConnection.makeRequest(url, {}, settings);
    if (!response.ok) {
      return ALL_ALLOWED;
    }
    const data = await response.json();
    const got = (data && data.permissions) || {};
    const has = (resource: string, action: string) =>
      Array.isArray(got[resource]) && got[resource].includes(action);
    return {
      read: has('contents', 'read'),
      write: has('contents', 'write'),
      run: has('kernels', 'execute')
    };
  } catch (reason) {
    console.warn('gpulab-jupyter: could not ask the server for permissions', reason);
    return ALL_ALLOWED;
  }
}
