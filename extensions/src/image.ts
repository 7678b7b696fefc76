/**
 * When the project's Dockerfile failed to build, gpulab starts the project on
 * the last image that built: the user is told where they look (a notification
 * when JupyterLab opens, a status bar item that stays, a line in the GPU
 * panel), with a link to the failed build's log. The server's `info` says so
 * (`image_state`, from the environment the hub gives the container).
 */
import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IStatusBar } from '@jupyterlab/statusbar';
import { Widget } from '@lumino/widgets';

import { IImageState, fetchInfo } from './api';
import { lastGoodText } from './format';

/** The hub's build log page as a URL this page can open ('' if there is none). */
export function buildLogUrl(hubPath: string): string {
  // The server only passes a path on the hub; the hub may sit on another origin.
  return hubPath.startsWith('/') && !hubPath.startsWith('//')
    ? PageConfig.getOption('hubHost') + hubPath
    : '';
}

/** JupyterLab cuts a notification's message at 140 characters (mid-word): a longer note
 * (the hub's names the image and when the build failed) shows whole in the status bar
 * item and the GPU panel, and the notification says it in a sentence that fits. */
const TOAST_MAX = 140;
export function toastText(text: string): string {
  return text.length <= TOAST_MAX
    ? text
    : "Running the last image that built: the Dockerfile's latest build failed. " +
        'Fix the Dockerfile, then restart the project.';
}

function openLog(url: string): void {
  window.open(url, '_blank', 'noopener');
}

/** The status bar item: `Last good image`, warning-coloured, for as long as the page lives. */
class LastGoodItem extends Widget {
  constructor(text: string, url: string) {
    super();
    this.addClass('jp-gpulab-LastGoodItem');
    this.node.setAttribute('data-gpulab', 'image-state');
    this.node.textContent = 'Last good image';
    this.node.title = url ? `${text}\nClick for the build log.` : text;
    if (url) {
      this.node.setAttribute('role', 'link');
      this.node.addEventListener('click', () => openLog(url));
    }
  }
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:image-state',
  description: "Tells the user when the project runs its last good image (the Dockerfile's build failed).",
  autoStart: true,
  optional: [IStatusBar],
  activate: (app: JupyterFrontEnd, statusBar: IStatusBar | null) => {
    // Not awaited: JupyterLab starts without waiting for the server's answer.
    void fetchInfo().then(
      info => tell(app, statusBar, info.image_state),
      reason => console.warn('gpulab-jupyter: no project info', reason)
    );
  }
};

function tell(app: JupyterFrontEnd, statusBar: IStatusBar | null, image: IImageState): void {
  if (!image || image.state !== 'last-good') {
    return;
  }
  const text = lastGoodText(image.note);
  const url = buildLogUrl(image.build_log_url);
  if (statusBar) {
    statusBar.registerStatusItem('gpulab-jupyter:image-state', {
      item: new LastGoodItem(text, url),
      align: 'left',
      rank: 3,
      isActive: () => true
    });
  }
  // Once the page is laid out, so that the notification is seen.
  void app.restored.then(() => {
    Notification.warning(toastText(text), {
      autoClose: false,
      actions: url ? [{ label: 'Open build log', callback: () => openLog(url) }] : []
    });
  });
}

export default plugin;
