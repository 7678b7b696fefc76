/**
 * The first Shift+Enter in a new notebook runs.
 *
 * JupyterLab 4.6 (and jupyter-collaboration 5.0, whose executor is JupyterLab's own
 * `runCell`) drops a cell run while the notebook's kernel is still "initializing": a
 * new notebook is editable before its session context has started a kernel (the
 * document context first writes a checkpoint, then starts one), and `runCell` then
 *
 * - finds a kernel pending (`hasNoKernel` false, no kernel yet): `CodeCell.execute`
 *   sees `session.kernel` null and clears the cell without a word; or
 * - finds no kernel asked for yet: starts one of its own, and the context's own start
 *   then preempts it (shut down) or reconnects over it (its request disposed).
 *
 * Either way the cell stays `[ ]:`, the cursor moves on, the kernel goes Idle, and no
 * error is shown (jupyterlab/jupyterlab#8490, open). This executor waits until the
 * context is past "initializing" (the state JupyterLab's own
 * `enableKernelInitNotification` warns about) and then hands the cell to
 * JupyterLab's `runCell`: the run is queued, shown as `[*]:`, as the classic Notebook
 * queued it.
 */
import { JupyterFrontEndPlugin } from '@jupyterlab/application';
import { ISessionContext } from '@jupyterlab/apputils';
import { ICodeCellModel } from '@jupyterlab/cells';
import { INotebookCellExecutor, runCell } from '@jupyterlab/notebook';

import { roomOf, runOnServer, serverSideHere } from './serverexec';

/** After this long a kernel that never came is JupyterLab's to report (its dialog). */
export const KERNEL_WAIT_MS = 120_000;

const waits = new WeakMap<ISessionContext, Promise<void>>();

/** Whether a run now would meet the kernel still being started (or not yet asked for). */
export function initializing(context: ISessionContext): boolean {
  return !context.isDisposed && context.kernelDisplayStatus === 'initializing';
}

/**
 * Resolves once ``context`` is past "initializing" (a kernel, "No Kernel", or disposed)
 * or after ``limitMs``. One promise per context, so cells queued together keep their
 * order.
 */
export function kernelSettled(
  context: ISessionContext,
  limitMs: number = KERNEL_WAIT_MS
): Promise<void> {
  if (!initializing(context)) {
    return Promise.resolve();
  }
  let wait = waits.get(context);
  if (!wait) {
    wait = new Promise<void>(resolve => {
      const check = () => {
        if (!initializing(context)) {
          finish();
        }
      };
      // Not every step of a start emits a signal (the pending kernel's name is set
      // quietly): a short poll as well.
      const poll = setInterval(check, 50);
      const limit = setTimeout(() => finish(), limitMs);
      const finish = () => {
        clearInterval(poll);
        clearTimeout(limit);
        context.statusChanged.disconnect(check);
        context.kernelChanged.disconnect(check);
        context.sessionChanged.disconnect(check);
        context.disposed.disconnect(check);
        waits.delete(context);
        resolve();
      };
      context.statusChanged.connect(check);
      context.kernelChanged.connect(check);
      context.sessionChanged.connect(check);
      context.disposed.connect(check);
      void context.ready.then(check, check);
    });
    waits.set(context, wait);
  }
  return wait;
}

/** Whether this code cell runs on the server's side (serverexec.ts). */
function onServer(options: INotebookCellExecutor.IRunCellOptions): boolean {
  return (
    options.cell.model.type === 'code' &&
    !!options.sessionContext &&
    serverSideHere() &&
    roomOf(options) !== ''
  );
}

/**
 * Runs a cell once the notebook's kernel is no longer starting: on the server's side
 * where it can (serverexec.ts), else as JupyterLab does.
 */
export async function runCellWhenKernelSettled(
  options: INotebookCellExecutor.IRunCellOptions
): Promise<boolean> {
  const { cell, sessionContext } = options;
  const server = onServer(options);
  if (cell.model.type !== 'code' || !sessionContext || !initializing(sessionContext)) {
    return server ? runOnServer(options, false) : runCell(options);
  }
  const model = cell.model as ICodeCellModel;
  model.executionState = 'running'; // [*]: queued, as it will run
  try {
    await kernelSettled(sessionContext);
  } finally {
    // On the server's side the server sets the prompt from now on: setting it idle
    // here could reach the document after the server marked the cell running.
    if (!cell.isDisposed && !(server && !sessionContext.isDisposed)) {
      model.executionState = 'idle';
    }
  }
  if (cell.isDisposed || sessionContext.isDisposed) {
    return false; // the notebook was closed meanwhile: start no kernel for it
  }
  return server ? runOnServer(options, true) : runCell(options);
}

/**
 * Provides the notebook cell executor in place of JupyterLab's, jupyter-collaboration's
 * and jupyter-server-nbmodel's (package.json: jupyterlab.disabledExtensions): one
 * executor that waits for a starting kernel and then runs the cell on the server's
 * side (docs/cells-on-the-server.md).
 */
const firstRun: JupyterFrontEndPlugin<INotebookCellExecutor> = {
  id: 'gpulab-jupyter:cell-executor',
  description:
    "Runs a cell on the server's side (outputs kept with no browser open); a cell " +
    'pressed while its kernel is still starting runs once it has started.',
  autoStart: true,
  provides: INotebookCellExecutor,
  activate: (): INotebookCellExecutor => {
    return Object.freeze({ runCell: runCellWhenKernelSettled });
  }
};

export default firstRun;
