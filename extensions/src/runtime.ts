/**
 * "Change runtime type…" (Kernel menu, command palette), as in Colab: it opens, in this
 * tab, the hub's page where the project's owner (or a collaborator the owner lets start
 * it) chooses CPU only or GPUs for the project; a running project restarts on the new
 * hardware with its files (spawner/gpulab_hub/home/runtime.py). The menu item is
 * declared in schema/runtime.json; outside a gpulab project the command is hidden.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';

import { hubContext, IHubContext, inProject } from './hub';

export const CHANGE_RUNTIME = 'gpulab:change-runtime';

/** The hub's runtime page of this project (the hub may sit on another origin). */
export function runtimeUrl(hub: IHubContext): string {
  const where = [hub.owner, hub.project].map(encodeURIComponent).join('/');
  return PageConfig.getOption('hubHost') + URLExt.join(hub.hubPrefix, 'gpulab/runtime', where);
}

const runtime: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:runtime',
  description: "Change runtime type: the hub's page that switches a project between CPU and GPUs.",
  autoStart: true,
  optional: [ICommandPalette],
  activate: (app: JupyterFrontEnd, palette: ICommandPalette | null) => {
    const hub = hubContext();
    const here = inProject(hub);
    app.commands.addCommand(CHANGE_RUNTIME, {
      label: 'Change runtime type…',
      caption: 'Run this project on CPU only or on GPUs (a running project restarts, its files kept)',
      isVisible: () => here,
      isEnabled: () => here,
      execute: () => {
        if (here) {
          window.location.assign(runtimeUrl(hub));
        }
      }
    });
    if (palette && here) {
      palette.addItem({ command: CHANGE_RUNTIME, category: 'Kernel' });
    }
  }
};

export default runtime;
