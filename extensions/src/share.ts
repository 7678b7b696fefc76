/**
 * Sharing in JupyterLab, for gpulab projects under JupyterHub:
 *
 * - "Share" (File menu, command palette, top bar): a dialog with the hub's
 *   share page for this project (who has access, links, revoke);
 * - "Save a copy" (File menu, notebook toolbar): the hub's page that copies
 *   the current notebook into one of the user's own projects;
 * - for people the project is shared with read-only: a top bar notice,
 *   notebooks open without a kernel (the server refuses kernels to them; this
 *   spares them JupyterLab's kernel error dialogs), and only what they can do
 *   is offered (viewer.ts).
 *
 * Menus and toolbar items are declared in schema/share.json; outside JupyterHub
 * the commands are hidden and nothing else happens.
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, ICommandPalette, Notification } from '@jupyterlab/apputils';
import { DocumentRegistry, IDocumentWidget } from '@jupyterlab/docregistry';
import { copyIcon, shareIcon } from '@jupyterlab/ui-components';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { Widget } from '@lumino/widgets';

import { fetchInfo } from './api';
import {
  ALL_ALLOWED,
  copyUrl,
  fetchPermissions,
  hubContext,
  IHubContext,
  inProject,
  IPermissions,
  shareUrl
} from './hub';
import { installViewerGuards, lockDocument } from './viewer';

export const SHARE = 'gpulab:share';
export const SAVE_COPY = 'gpulab:save-copy';
export const READ_ONLY = 'gpulab:read-only-info';

/** How long JupyterLab waits for the server's answer on permissions at start. */
const PERMISSIONS_TIMEOUT_MS = 5000;

/** The hub's share page in a frame (same origin: the hub's pages allow it). */
class ShareFrame extends Widget {
  constructor(url: string, project: string) {
    super();
    this.addClass('jp-gpulab-ShareFrame');
    const frame = document.createElement('iframe');
    frame.src = url;
    frame.title = `Share ${project}`;
    frame.setAttribute('allow', 'clipboard-write');
    frame.dataset.gpulab = 'share-frame';
    this.node.appendChild(frame);
  }
}

function openShareDialog(hub: IHubContext): Promise<void> {
  const dialog = new Dialog({
    title: `Share ${hub.project}`,
    body: new ShareFrame(shareUrl(hub), hub.project),
    buttons: [Dialog.okButton({ label: 'Done' })]
  });
  dialog.addClass('jp-gpulab-ShareDialog');
  dialog.node.dataset.gpulab = 'share-dialog';
  return dialog.launch().then(() => undefined);
}

/** The path of the document in ``widget``, if it is one. */
function documentPath(widget: Widget | null): string {
  const context = (widget as Partial<IDocumentWidget> | null)?.context;
  return context && typeof context.path === 'string' ? context.path : '';
}

async function withTimeout<T>(promise: Promise<T>, ms: number, fallback: T): Promise<T> {
  let timer = 0;
  const late = new Promise<T>(resolve => {
    timer = window.setTimeout(() => resolve(fallback), ms);
  });
  try {
    return await Promise.race([promise, late]);
  } finally {
    window.clearTimeout(timer);
  }
}

/** Commands that run code or (re)start a kernel. */
const RUNS_CODE = /^(notebook|runmenu|kernelmenu|console):[\w-]*(run|restart|execute)/;

/** Commands that run code or start, stop or change a kernel: disabled where the user may not run code. */
export const KERNEL_COMMANDS =
  /^((notebook|runmenu|kernelmenu|console):[\w-]*(run|restart|execute|interrupt|shutdown|change-kernel|reconnect)|(runmenu|kernelmenu):)/;

/**
 * Where the user may not run code, the run commands look disabled (toolbar
 * buttons, menus, the palette) and are not executable; those still reached (keys,
 * another extension) show ``refuse`` instead: without a kernel, JupyterLab would clear
 * the outputs of the cells it was asked to run. Markdown cells still render.
 */
function guardRunCommands(app: JupyterFrontEnd, refuse: () => void): void {
  const commands = app.commands;
  const isEnabled = commands.isEnabled.bind(commands);
  commands.isEnabled = (id: string, args?: ReadonlyPartialJSONObject) => {
    if (!KERNEL_COMMANDS.test(id)) {
      return isEnabled(id, args);
    }
    // Keys (Shift+Enter) still reach the command, which shows the notice: a disabled
    // one would swallow the key and say nothing. Lumino marks a key binding's call.
    const event = (args as { _luminoEvent?: { type?: unknown } } | undefined)?._luminoEvent;
    return event?.type === 'keybinding' && isEnabled(id, args);
  };
  // One by one: toolbar buttons ignore a change that names no command.
  for (const id of commands.listCommands()) {
    if (KERNEL_COMMANDS.test(id)) {
      commands.notifyCommandChanged(id);
    }
  }
  const execute = commands.execute.bind(commands);
  commands.execute = (id: string, args?: ReadonlyPartialJSONObject) => {
    if (!RUNS_CODE.test(id) && !KERNEL_COMMANDS.test(id)) {
      return execute(id, args);
    }
    type Notebook = { activeCell?: { model?: { type?: string } } };
    const notebook = (app.shell.currentWidget as { content?: Notebook } | null)?.content;
    const cell = notebook?.activeCell?.model?.type;
    if (id === 'notebook:run-cell-and-select-next' && cell && cell !== 'code') {
      return execute(id, args);
    }
    refuse();
    return Promise.resolve(undefined);
  };
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:share',
  description:
    'Share a gpulab project from JupyterLab, save a copy of a notebook, and the read-only view of shared projects.',
  autoStart: true,
  optional: [ICommandPalette],
  activate: async (app: JupyterFrontEnd, palette: ICommandPalette | null) => {
    const hub = hubContext();
    const shared = inProject(hub);
    let permissions: IPermissions = ALL_ALLOWED;
    // Asked at once: documents restored before the answer wait for it.
    const permissionsReady = shared
      ? withTimeout(fetchPermissions(), PERMISSIONS_TIMEOUT_MS, ALL_ALLOWED)
      : Promise.resolve(ALL_ALLOWED);
    // The last document the user looked at, for "Save a copy" from the top bar.
    let lastPath = '';
    let lastNotice = 0;

    // The notebook to copy: the one named, the current one, or the last one seen.
    const pathFor = (args: { path?: unknown }) => {
      const path =
        typeof args.path === 'string' && args.path
          ? args.path
          : documentPath(app.shell.currentWidget) || lastPath;
      return path.endsWith('.ipynb') ? path : '';
    };

    app.commands.addCommand(SHARE, {
      label: 'Share',
      caption: shared
        ? `Share ${hub.project}: people, groups, links; who has access`
        : 'Share this project (in a gpulab project only)',
      icon: shareIcon,
      className: 'jp-gpulab-ShareButton',
      // Viewers never share on (only collaborators may, where the owner allows it).
      isVisible: () => shared && permissions.write,
      execute: () => (shared ? openShareDialog(hub) : undefined)
    });

    app.commands.addCommand(SAVE_COPY, {
      label: 'Save a copy',
      caption: 'Copy this notebook into one of your own projects, and open it there',
      icon: copyIcon,
      className: 'jp-gpulab-SaveCopyButton',
      isVisible: () => shared,
      isEnabled: args => shared && !!pathFor(args),
      execute: args => {
        const path = pathFor(args);
        if (!shared || !path) {
          return;
        }
        window.open(copyUrl(hub, path), '_blank');
      }
    });

    app.commands.addCommand(READ_ONLY, {
      label: () => `Viewing ${hub.owner}'s project read-only — Save a copy to run it`,
      caption: `${hub.owner} shared ${hub.project} with you to read: kernels and terminals do not start, files are not saved. Click to copy the current notebook into a project of yours.`,
      className: 'jp-gpulab-ReadOnly',
      isVisible: () => shared && !permissions.write,
      execute: () => {
        if (pathFor({})) {
          return app.commands.execute(SAVE_COPY, {});
        }
        Notification.info('Open a notebook of this project, then Save a copy of it.', {
          autoClose: 5000
        });
      }
    });

    if (palette) {
      palette.addItem({ command: SHARE, category: 'Sharing' });
      palette.addItem({ command: SAVE_COPY, category: 'Sharing' });
    }

    const noticeNoKernel = (path: string) => {
      const now = Date.now();
      if (now - lastNotice < 5000) {
        return;
      }
      lastNotice = now;
      Notification.warning(
        `${hub.owner} shared this project with you read-only: code does not run here. Save a copy to run it in a project of yours.`,
        {
          autoClose: 10000,
          actions: [
            {
              label: 'Save a copy',
              callback: () => void app.commands.execute(SAVE_COPY, { path })
            }
          ]
        }
      );
    };

    // Notebooks of a project where the user may not run code: no kernel, and
    // a notice instead of JupyterLab's kernel dialogs when they try.
    const noKernels: DocumentRegistry.IWidgetExtension<Widget, DocumentRegistry.IModel> = {
      createNew: (widget, context) => {
        void permissionsReady.then(p => {
          if (!p.write) {
            // JupyterLab's own read-only state: its save button says so instead of trying.
            context.model.readOnly = true;
            lockDocument(widget);
          }
        });
        if (permissions.run) {
          return;
        }
        // Neither start a kernel nor join the kernel someone else runs on this notebook.
        const session = context.sessionContext;
        session.kernelPreference = {
          ...session.kernelPreference,
          shouldStart: false,
          canStart: false,
          shouldReuse: false,
          autoStartDefault: false
        };
        session.startKernel = async () => {
          noticeNoKernel(context.path);
          return false;
        };
        widget.addClass('jp-gpulab-mod-readOnly');
      }
    };
    app.docRegistry.addWidgetExtension('Notebook', noKernels);
    app.docRegistry.addWidgetExtension('Editor', {
      createNew: widget => {
        void permissionsReady.then(p => {
          if (!p.write) {
            lockDocument(widget);
          }
        });
      }
    });

    app.shell.currentChanged?.connect(() => {
      const path = documentPath(app.shell.currentWidget);
      if (path.endsWith('.ipynb')) {
        lastPath = path;
      }
      app.commands.notifyCommandChanged(SAVE_COPY);
      app.commands.notifyCommandChanged(READ_ONLY);
    });

    if (!shared) {
      return;
    }
    permissions = await permissionsReady;
    if (!permissions.run) {
      guardRunCommands(app, () => noticeNoKernel(documentPath(app.shell.currentWidget)));
    }
    if (!permissions.write) {
      const refusal = await fetchInfo().then(
        info => info.refusal,
        () => ''
      );
      installViewerGuards(app, {
        refusal,
        saveCopy: () => void app.commands.execute(SAVE_COPY, {})
      });
    }
    document.body.dataset.gpulabAccess = permissions.write
      ? 'write'
      : permissions.read
        ? 'read'
        : 'none';
    // One by one: toolbar buttons ignore a change that names no command.
    for (const id of [SHARE, SAVE_COPY, READ_ONLY]) {
      app.commands.notifyCommandChanged(id);
    }
  }
};

export default plugin;
