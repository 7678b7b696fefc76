/**
 * A code cell runs on the server's side (jupyter-server-nbmodel), not through this tab.
 *
 * The cell is handed to ``POST api/kernels/<id>/execute`` with the notebook's
 * collaboration room id and its path: the server runs it through its own kernel
 * client, queues it behind the kernel's other cells (Run All, a collaborator's
 * Shift+Enter), and writes its outputs, prompt and count into the notebook's shared
 * document whether or not any browser is connected; the document saves itself. This
 * tab then only waits for the end (polling the request) to tell JupyterLab; it never
 * writes an output itself: the server is the one writer, so a reload, a second tab or
 * a lost connection cannot drop or repeat one, and a reload never runs a cell again
 * (nothing is posted on load). Submissions to one kernel are sent one after the
 * other, so the server queues cells in the order they were run.
 *
 * Used where the server says it can (``gpulabServerSideExecution`` in the page's
 * config, set by gpulab_jupyter/cells.py) and the notebook is a collaborative
 * document; anything else runs through JupyterLab's ``runCell``.
 */
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { ICodeCellModel } from '@jupyterlab/cells';
import { PageConfig, URLExt } from '@jupyterlab/coreutils';
import { INotebookCellExecutor } from '@jupyterlab/notebook';
import { ServerConnection } from '@jupyterlab/services';

/** Whether this server runs cells on its side (page config from gpulab's server extension). */
export function serverSideHere(): boolean {
  return PageConfig.getOption('gpulabServerSideExecution') === 'true';
}

/** The notebook's collaboration room (``json:notebook:<file id>``), or '' when it has none. */
export function roomOf(options: INotebookCellExecutor.IRunCellOptions): string {
  const id = options.notebook.sharedModel.getState('document_id');
  return typeof id === 'string' ? id : '';
}

const submissions = new Map<string, Promise<void>>();

/** Runs ``submit`` after the previous submission to ``kernelId`` was accepted. */
function inOrder<T>(kernelId: string, submit: () => Promise<T>): Promise<T> {
  const before = submissions.get(kernelId) ?? Promise.resolve();
  const mine = before.then(submit);
  const done = mine.then(
    () => undefined,
    () => undefined
  );
  submissions.set(kernelId, done);
  void done.then(() => {
    if (submissions.get(kernelId) === done) {
      submissions.delete(kernelId);
    }
  });
  return mine;
}

const sleep = (ms: number) => new Promise(resolve => setTimeout(resolve, ms));

/** How long to wait before the ``n``th poll of a running request (ms). */
export function pollDelay(n: number): number {
  return Math.min(1000, 100 * 2 ** Math.min(n, 4));
}

/** What this tab does with one answer of the request's poll. */
export type PollStep = 'wait' | 'done' | 'failed' | 'input' | 'gone';

export function stepFor(status: number): PollStep {
  if (status === 202) {
    return 'wait';
  }
  if (status === 200) {
    return 'done';
  }
  if (status === 300) {
    return 'input';
  }
  if (status === 404) {
    return 'gone'; // answered elsewhere (another tab of the same run) or the server restarted
  }
  return status >= 500 && status < 600 ? 'failed' : 'gone';
}

/**
 * After the run: the queued mark this tab set could reach the shared document after the
 * server's own end of the run (the two travel apart), leaving [*]: on a cell that ran.
 * Unless the server is running the cell again (its metadata names a request), the
 * mark goes.
 */
function settle(model: ICodeCellModel, disposed: boolean): void {
  if (disposed || model.executionState !== 'running') {
    return;
  }
  if (model.getMetadata('jupyter_server_nbmodel') === undefined) {
    model.executionState = 'idle';
  }
}

/** Sends the cell to the server and resolves once it ran: whether it ran without error. */
export async function runOnServer(
  options: INotebookCellExecutor.IRunCellOptions,
  waitedForKernel: boolean
): Promise<boolean> {
  const { cell, sessionContext, sessionDialogs, onCellExecuted } = options;
  const model = cell.model as ICodeCellModel;
  const settings = ServerConnection.makeSettings();
  const context = sessionContext!;
  if (context.hasNoKernel) {
    const shouldSelect = await context.startKernel();
    if (shouldSelect && sessionDialogs) {
      await sessionDialogs.selectKernel(context);
    }
  }
  const kernelId = context.session?.kernel?.id;
  if (!kernelId) {
    if (waitedForKernel && !cell.isDisposed) {
      model.executionState = 'idle';
    }
    model.sharedModel.transact(() => model.clearExecution());
    return true;
  }
  const body = JSON.stringify({
    code: model.sharedModel.getSource(),
    metadata: {
      cell_id: model.sharedModel.getId(),
      document_id: roomOf(options),
      document_path: context.session?.path ?? '',
      record_timing: !!options.notebookConfig?.recordTiming
    }
  });
  options.onCellExecutionScheduled({ cell });
  // [*]: queued. The server marks the cell running only once it starts it, so a cell
  // waiting behind another one (Run All, a collaborator's running cell) would show
  // [ ]: until then; this mark is shared, so every open tab shows it queued.
  if (!cell.isDisposed) {
    model.executionState = 'running';
  }
  let request: { request_id?: string } = {};
  try {
    request = await inOrder(kernelId, async () => {
      const url = URLExt.join(settings.baseUrl, 'api/kernels', kernelId, 'execute');
      const reply = await ServerConnection.makeRequest(url, { method: 'POST', body }, settings);
      if (reply.status !== 202) {
        throw new ServerConnection.ResponseError(reply);
      }
      return reply.json();
    });
  } catch (reason) {
    if (!cell.isDisposed) {
      model.executionState = 'idle';
    }
    void showDialog({
      title: 'The cell did not run',
      body: `The server did not take it: ${(reason as Error).message ?? reason}`,
      buttons: [Dialog.okButton()]
    });
    onCellExecuted({ cell, success: false });
    return false;
  }
  const poll = URLExt.join(
    settings.baseUrl,
    'api/kernels',
    kernelId,
    'requests',
    String(request.request_id)
  );
  let success = true;
  for (let n = 0; ; n++) {
    await sleep(pollDelay(n));
    let reply: Response;
    try {
      reply = await ServerConnection.makeRequest(poll, { method: 'GET' }, settings);
    } catch {
      await sleep(2000); // offline for a moment: the cell runs on regardless
      continue;
    }
    const step = stepFor(reply.status);
    if (step === 'wait') {
      continue;
    }
    const data = await reply.json().catch(() => ({}));
    if (step === 'input') {
      const asked = data?.input_request ?? {};
      const answer = asked.password
        ? await InputDialog.getPassword({ title: String(asked.prompt || 'Password') })
        : await InputDialog.getText({ title: String(asked.prompt || 'Input') });
      await ServerConnection.makeRequest(
        URLExt.join(settings.baseUrl, 'api/kernels', kernelId, 'input'),
        { method: 'POST', body: JSON.stringify({ input: answer.value ?? '' }) },
        settings
      );
      continue;
    }
    success = step === 'done' ? data?.status === 'ok' : step === 'gone';
    break;
  }
  settle(model, cell.isDisposed);
  onCellExecuted({ cell, success });
  return success;
}
