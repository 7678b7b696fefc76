/**
 * gpulab's JupyterLab extension: a GPU status bar item and a GPU panel, fed by
 * the server extension under /api/gpulab/v1/ (works in any JupyterLab 4), and
 * sharing of gpulab projects under JupyterHub (share.ts), and the notice that a
 * project runs its last good image (image.ts), and jobs: the Jobs panel, Run as
 * job, their end and the idle notice (jobsplugin.ts); and cells run on the server's
 * side, a cell run while its notebook's kernel is still starting once it has started
 * (firstrun.ts, serverexec.ts), with the status bar's "running while you were away"
 * (cellsstatus.ts); and the tab a person opened while JupyterLab restores their
 * workspace stays in front (restorefocus.ts).
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette, MainAreaWidget, WidgetTracker } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

import accessEnded from './accessended';
import cellsStatus from './cellsstatus';
import { fetchInfo } from './api';
import firstRun from './firstrun';
import { DEFAULT_THRESHOLDS, IThresholds } from './format';
import imageState from './image';
import { GpuModel } from './model';
import { nameProjectInTitle } from './pagetitle';
import { GpuPanel } from './panel';
import sharing from './share';
import { GpuStatusItem } from './statusbar';
import jobs from './jobsplugin';
import reclaimWarning from './reclaimwarn';
import restoreFocus from './restorefocus';
import runtime from './runtime';
import { IGpuStatus } from './tokens';

const PLUGIN_ID = 'gpulab-jupyter:plugin';
const OPEN = 'gpulab:open-gpu-panel';

const plugin: JupyterFrontEndPlugin<GpuModel> = {
  id: PLUGIN_ID,
  description: "The GPU status of this project's container: status bar item and panel.",
  autoStart: true,
  provides: IGpuStatus,
  optional: [IStatusBar, ISettingRegistry, ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    settings: ISettingRegistry | null,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const model = new GpuModel();
    let thresholds: IThresholds = { ...DEFAULT_THRESHOLDS };
    const tracker = new WidgetTracker<MainAreaWidget<GpuPanel>>({ namespace: 'gpulab-gpu' });
    let item: GpuStatusItem | null = null;

    app.commands.addCommand(OPEN, {
      label: 'GPU Status',
      caption: "Open the GPU panel: this container's GPUs and their processes",
      execute: () => {
        let widget = tracker.currentWidget;
        if (!widget || widget.isDisposed) {
          const panel = new GpuPanel(model);
          panel.thresholds = thresholds;
          widget = new MainAreaWidget({ content: panel });
          widget.id = 'gpulab-gpu-panel';
          widget.title.label = 'GPU';
          widget.title.caption = 'GPU status of this server';
          widget.title.closable = true;
          void tracker.add(widget);
        }
        if (!widget.isAttached) {
          app.shell.add(widget, 'main', { mode: 'split-right' });
        }
        app.shell.activateById(widget.id);
        model.refreshNow(); // fresh numbers now, also after errors (no waiting out a backoff)
        return widget;
      }
    });
    if (palette) {
      palette.addItem({ command: OPEN, category: 'GPU' });
    }
    if (restorer) {
      void restorer.restore(tracker, { command: OPEN, name: () => 'gpulab-gpu' });
    }

    if (statusBar) {
      item = new GpuStatusItem(model, () => void app.commands.execute(OPEN));
      statusBar.registerStatusItem('gpulab-jupyter:gpu-status', {
        item,
        align: 'left',
        rank: 4,
        isActive: () => true
      });
    }

    const apply = (s: ISettingRegistry.ISettings) => {
      const c = s.composite as { [key: string]: number };
      model.refreshInterval = Number(c.refreshInterval) || 2;
      thresholds = {
        memoryWarning: Number(c.memoryWarning),
        memoryCritical: Number(c.memoryCritical),
        temperatureWarning: Number(c.temperatureWarning),
        temperatureCritical: Number(c.temperatureCritical)
      };
      if (item) {
        item.thresholds = thresholds;
      }
      tracker.forEach(w => (w.content.thresholds = thresholds));
      model.refreshNow();
    };
    if (settings) {
      settings
        .load(PLUGIN_ID)
        .then(s => {
          apply(s);
          s.changed.connect(apply);
        })
        .catch(reason => console.error('gpulab-jupyter: settings not loaded', reason));
    }
    model.start();
    // The browser tab names the project (under gpulab's hub; a plain JupyterLab has none).
    fetchInfo()
      .then(info => nameProjectInTitle(info.display_name || ''))
      .catch(() => undefined); // the model's start says why the server did not answer
    return model;
  }
};

export default [
  plugin,
  sharing,
  imageState,
  jobs,
  accessEnded,
  reclaimWarning,
  runtime,
  firstRun,
  cellsStatus,
  restoreFocus
];
