/**
 * Jobs in JupyterLab (docs/jobs.md): the Jobs panel in the left sidebar, "Run
 * as job" on .py and .ipynb files (file browser context menu) and on the open
 * notebook or script (notebook toolbar, command palette), a notification when a
 * job ends, and the idle notice with "Keep it running". Viewers are offered
 * none of the starting and stopping (the server refuses them anyway; its words
 * are shown if it does).
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, Notification } from '@jupyterlab/apputils';
import { DocumentRegistry, IDocumentWidget } from '@jupyterlab/docregistry';
import { IFileBrowserFactory } from '@jupyterlab/filebrowser';
import { runIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { fetchInfo } from './api';
import { IdleWatch } from './idle';
import { JobsModel } from './jobs';
import { IJob, endText, jobTitle, logPath } from './jobsapi';
import { JobsPanel } from './jobspanel';
import { GpuModel } from './model';
import { IGpuStatus } from './tokens';

export const OPEN_JOBS = 'gpulab:open-jobs';
/** Run the open notebook or script as a job (notebook toolbar, palette). */
export const RUN_AS_JOB = 'gpulab:run-as-job';
/** Run the file selected in the file browser as a job (its context menu). */
export const RUN_FILE_AS_JOB = 'gpulab:run-file-as-job';

/** How long Run as job waits for the server to save a collaborative notebook. */
const SERVER_SAVE_MS = 10_000;

/**
 * Whether ``model`` (a collaborative document) became clean, saved by the server, within
 * ``ms``.
 */
function savedByServer(model: DocumentRegistry.IModel, ms: number): Promise<boolean> {
  if (!model.dirty) {
    return Promise.resolve(true);
  }
  return new Promise(resolve => {
    const onState = (_: DocumentRegistry.IModel, change: { name: string }) => {
      if (change.name === 'dirty' && !model.dirty) {
        done(true);
      }
    };
    const timer = setTimeout(() => done(false), ms);
    const done = (saved: boolean) => {
      clearTimeout(timer);
      model.stateChanged.disconnect(onState);
      resolve(saved);
    };
    model.stateChanged.connect(onState);
  });
}

const RUNNABLE = /\.(py|ipynb)$/;

function documentPath(widget: Widget | null): string {
  const context = (widget as Partial<IDocumentWidget> | null)?.context;
  return context && typeof context.path === 'string' ? context.path : '';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:jobs',
  description: 'Jobs: run a script or notebook detached from the browser, follow and stop it.',
  autoStart: true,
  optional: [IGpuStatus, IFileBrowserFactory, ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    gpu: GpuModel | null,
    browsers: IFileBrowserFactory | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const jobs = new JobsModel(gpu);
    const idle = new IdleWatch();
    // Until the server says otherwise, offer running (it refuses viewers anyway).
    let canRun = true;
    fetchInfo()
      .then(info => {
        canRun = !info.refusal;
        app.commands.notifyCommandChanged();
        panel.render();
      })
      .catch(reason => console.warn('gpulab-jupyter: no project info', reason));

    const open = (path: string, factory?: string) =>
      void app.commands.execute('docmanager:open', factory ? { path, factory } : { path });
    const openLog = (job: IJob) => open(logPath(job), 'Editor');
    const refused = (what: string, reason: unknown) =>
      Notification.error(`${what}: ${reason instanceof Error ? reason.message : String(reason)}`, {
        autoClose: 10000
      });

    const panel = new JobsPanel({
      jobs,
      idle,
      gpu,
      canRun: () => canRun,
      openLog,
      openNotebook: job => open(job.output),
      act: (action, job) => {
        const call = action === 'stop' ? jobs.stop(job.id) : jobs.rerun(job.id);
        call
          .then(j => {
            if (action === 'rerun') {
              panel.focusJob = j.id;
            }
          })
          .catch(reason =>
            refused(`${action === 'stop' ? 'Stop' : 'Re-run'} ${jobTitle(job)}`, reason)
          );
      }
    });
    panel.id = 'gpulab-jobs';
    panel.title.icon = runIcon;
    // Named beside its icon, not an unlabelled icon; the caption says more on hover.
    panel.title.label = 'Jobs';
    app.shell.add(panel, 'left', { rank: 600 });
    if (restorer) {
      restorer.add(panel, 'gpulab-jobs');
    }

    app.commands.addCommand(OPEN_JOBS, {
      label: 'Jobs',
      caption: "Open the Jobs panel: this project's jobs, their output, Stop and Re-run",
      execute: () => {
        app.shell.activateById(panel.id);
        void jobs.refresh();
      }
    });

    const run = async (path: string) => {
      if (!RUNNABLE.test(path)) {
        return;
      }
      try {
        const job = await jobs.run({ target: path });
        app.shell.activateById(panel.id);
        panel.focusJob = job.id;
      } catch (reason) {
        refused(`${path} did not start as a job`, reason);
      }
    };

    const selected = (): string => {
      const item = browsers?.tracker.currentWidget?.selectedItems().next();
      return item && !item.done ? item.value.path : '';
    };

    app.commands.addCommand(RUN_FILE_AS_JOB, {
      label: 'Run as job',
      caption: 'Run this file in the project, on without the browser; follow it in the Jobs panel',
      icon: runIcon,
      isVisible: () => canRun && RUNNABLE.test(selected()),
      execute: () => run(selected())
    });

    const current = (args: { path?: unknown }): string => {
      const path = typeof args.path === 'string' ? args.path : documentPath(app.shell.currentWidget);
      return RUNNABLE.test(path) ? path : '';
    };
    app.commands.addCommand(RUN_AS_JOB, {
      label: 'Run as job',
      caption:
        'Run this notebook or script as a job: it runs on with the browser closed ' +
        '(the saved file runs; a notebook job writes an executed copy next to it)',
      icon: runIcon,
      isVisible: () => canRun,
      isEnabled: args => !!current(args),
      execute: async args => {
        const path = current(args);
        const widget = app.shell.currentWidget as Partial<IDocumentWidget> | null;
        if (widget?.context?.path === path && widget.context.model.dirty) {
          // The job runs what is on disk. A collaborative document is saved by the server
          // itself within a second: a Save of the tab's meanwhile can meet that save and
          // stop at JupyterLab's "File Changed" question, and the job would never start.
          const model = widget.context.model;
          if (!(model.collaborative && (await savedByServer(model, SERVER_SAVE_MS)))) {
            await widget.context.save();
          }
        }
        return run(path);
      }
    });

    app.contextMenu.addItem({
      command: RUN_FILE_AS_JOB,
      selector: '.jp-DirListing-item[data-file-type="python"]',
      rank: 3
    });
    app.contextMenu.addItem({
      command: RUN_FILE_AS_JOB,
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 3
    });
    if (palette) {
      palette.addItem({ command: OPEN_JOBS, category: 'Jobs' });
      palette.addItem({ command: RUN_AS_JOB, category: 'Jobs' });
    }

    jobs.ended.connect((_, job) => {
      const text = endText(job);
      const options = {
        autoClose: 15000 as number | false,
        actions: [{ label: 'Open log', callback: () => openLog(job) }]
      };
      if (job.output && job.state !== 'lost') {
        options.actions.push({ label: 'Open executed notebook', callback: () => open(job.output) });
      }
      if (job.state === 'succeeded') {
        Notification.success(text, options);
      } else if (job.state === 'stopped') {
        Notification.info(text, options);
      } else {
        Notification.error(text, { ...options, autoClose: false });
      }
    });

    // A job starts or ends: what keeps the project changes (the panel's header).
    let running = false;
    jobs.changed.connect(() => {
      if (jobs.running !== running) {
        running = jobs.running;
        void idle.refresh();
      }
    });
    jobs.start();
    idle.start();
  }
};

export default plugin;
