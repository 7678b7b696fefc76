/**
 * When this person's access to the project ends (the owner stops sharing it, or
 * the link they accepted expires) or is lowered while JupyterLab is open: one
 * dialog in gpulab's words, at once, instead of JupyterLab's "Kernel died
 * unexpectedly", its reconnect attempts and a bare 403 page.
 *
 * How it is known: the project server re-checks open websockets
 * (gpulab_jupyter/connections.py) and closes those whose person lost access
 * with code 4403 (CLOSE_CODE there); the GPU status poll is refused (HTTP 403)
 * once the server knows. Kernel and terminal websockets, made through the
 * service manager's settings, are wrapped here: a 4403 close stops there, so
 * JupyterLab never tries to reconnect or asks the server whether the kernel is
 * alive (the refused answer is what made it say "Kernel died"). The server's
 * `info` then says what is left: refused (access ended: the open documents are
 * closed, a dialog links to the hub's home page) or a viewer's answer (access
 * lowered: a dialog asks to reload as a viewer).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import { Widget } from '@lumino/widgets';

import { fetchInfo, IInfo, requestAPI } from './api';
import { hubContext, inProject } from './hub';
import { GpuModel } from './model';
import { IGpuStatus } from './tokens';

/** The close code of a websocket whose person lost access (gpulab_jupyter/connections.py). */
export const ACCESS_CLOSE_CODE = 4403;

/** What happened to this person's access. */
export type Change = 'ended' | 'lowered';

/** The dialog's words: title and sentence, for ``change`` of ``owner``'s ``project``. */
export function accessWords(change: Change, owner: string, project: string): [string, string] {
  const name = `“${project}”`;
  if (change === 'ended') {
    return [
      `You no longer have access to ${name}`,
      `${owner} stopped sharing ${name} with you. ` +
        'Your open notebooks here are closed; nothing of yours was lost.'
    ];
  }
  return [
    `You can now only read ${name}`,
    `${owner} made you a viewer of ${name}: you can read it, not change or run anything. ` +
      'Reload to go on as a viewer; nothing of yours was lost.'
  ];
}

type WebSocketClass = typeof WebSocket;

/**
 * ``Base`` whose sockets call ``onClosed`` when the server closes them with
 * ACCESS_CLOSE_CODE; with ``swallow`` that close goes no further (its owner
 * never sees it).
 */
function watching(Base: WebSocketClass, onClosed: () => void, swallow: boolean): WebSocketClass {
  return class extends Base {
    constructor(url: string | URL, protocols?: string | string[]) {
      super(url, protocols);
      // Added before its owner sets onclose: this listener runs first.
      this.addEventListener('close', (event: CloseEvent) => {
        if (event.code !== ACCESS_CLOSE_CODE) {
          return;
        }
        if (swallow) {
          event.stopImmediatePropagation();
        }
        onClosed();
      });
    }
  };
}

/** The link home, as a widget for the dialog's body. */
function body(text: string, home: string, change: Change): Widget {
  const node = document.createElement('div');
  node.dataset.gpulab = 'access-' + change;
  const p = document.createElement('p');
  p.textContent = text;
  node.appendChild(p);
  if (change === 'ended') {
    const link = document.createElement('a');
    link.href = home;
    link.id = 'gpulab-access-ended-home';
    link.textContent = 'Back to your projects';
    link.style.fontWeight = '600';
    const line = document.createElement('p');
    line.appendChild(link);
    node.appendChild(line);
  }
  return new Widget({ node });
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:access-ended',
  description: "Say so, in gpulab's words, when this person's access to the project ends.",
  autoStart: true,
  optional: [IGpuStatus],
  activate: (app: JupyterFrontEnd, gpu: GpuModel | null) => {
    const hub = hubContext();
    if (!inProject(hub)) {
      return;
    }
    const home = hub.hubPrefix.replace(/\/?$/, '/') + 'home';
    // Asked while access lasts: whose project, and its name, for the dialog.
    const known: Promise<IInfo | null> = fetchInfo().catch(() => null);
    let said = false;
    let asking = false;

    const tell = async (change: Change) => {
      if (said) {
        return;
      }
      said = true;
      const info = await known;
      const owner = info?.owner || hub.owner;
      const project = info?.display_name || hub.project;
      if (change === 'ended') {
        // Their documents, terminals and consoles can do nothing more: closed, without
        // JupyterLab's questions (the kernels on the server are the owner's and run on).
        for (const widget of Array.from(app.shell.widgets('main'))) {
          if (widget.id !== 'gpulab-gpu-panel') {
            widget.dispose();
          }
        }
      }
      const [title, text] = accessWords(change, owner, project);
      const button =
        change === 'ended'
          ? Dialog.okButton({ label: 'Go to your projects' })
          : Dialog.okButton({ label: 'Reload' });
      const result = await new Dialog({
        title,
        body: body(text, home, change),
        buttons: [button],
        hasClose: false
      }).launch();
      if (change === 'lowered') {
        window.location.reload();
      } else if (result.button.accept) {
        window.location.assign(home);
      }
    };

    // A 4403 close, or a refused poll: ask the server what is left, once at a time.
    const check = async () => {
      if (said || asking) {
        return;
      }
      asking = true;
      try {
        const info = await requestAPI<IInfo>('info');
        if (info.refusal) {
          await tell('lowered');
        }
      } catch (reason) {
        if (
          reason instanceof ServerConnection.ResponseError &&
          reason.response.status === 403
        ) {
          await tell('ended');
        }
      } finally {
        asking = false;
      }
    };

    const settings = app.serviceManager.serverSettings as { WebSocket: WebSocketClass };
    const onClosed = () => void check();
    // Kernels and terminals: their 4403 close stops here (see above).
    settings.WebSocket = watching(settings.WebSocket, onClosed, true);
    // Collaboration rooms (made with the page's WebSocket): seen, left to reconnect.
    window.WebSocket = watching(window.WebSocket, onClosed, false);
    if (gpu) {
      gpu.changed.connect(() => {
        if (gpu.stale?.noAccess) {
          void check();
        }
      });
    }
  }
};

export default plugin;
