/**
 * What a viewer of a shared project is offered: what the role can do, and no
 * more. Launcher tiles, the file browser's "+", new folder and upload buttons
 * are hidden (style/share.css, keyed on `body[data-gpulab-access=read]`);
 * commands that would change a file or the notebook are disabled in menus and
 * say why when a key or button still reaches them; notebook cells and editors
 * are read-only. Where the server still refuses (a file dropped on the file
 * browser, say), its answer is in the same words: both come from the server's
 * `info` (`refusal`, made by gpulab_jupyter/authorizer.py).
 */
import { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { ReadonlyPartialJSONObject } from '@lumino/coreutils';
import { ISignal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';

/** Commands that make, change, move or delete files, cells or outputs, or start kernels. */
const CHANGES = new RegExp(
  '^(' +
    [
      'notebook:(create-new|insert-|delete-cell|cut-cell|paste-cell|paste-and-replace|' +
        'move-cell|change-cell-to|merge-cell|split-cell|clear-|duplicate-|' +
        'undo-cell-action|redo-cell-action|trust|create-console|create-subshell-console)',
      'docmanager:(save|rename|delete|duplicate|clone|restore-checkpoint|new-untitled)',
      'filebrowser:(create-new|rename|delete|cut|paste|duplicate)',
      'fileeditor:(create-new|create-console)',
      'console:create',
      'terminal:create-new',
      'filemenu:create-console',
      'running:kernel-new'
    ].join('|') +
    ')'
);

/** What a viewer is told when the server did not say (it always does under gpulab). */
const FALLBACK = 'You can read this project, but not change or run anything here. Save a copy to work on it.';

export interface IViewerOptions {
  /** The server's words for a refusal ('' if it gave none). */
  refusal: string;
  /** Save a copy of the current notebook (the Save a copy command). */
  saveCopy: () => void;
}

/** A widget whose cells or editor can be made read-only (duck-typed: notebook or editor). */
interface ICellLike {
  readOnly: boolean;
  syncEditable?: boolean;
}
interface IContentLike {
  widgets?: ReadonlyArray<ICellLike>;
  model?: { cells?: { changed: ISignal<unknown, unknown> } } | null;
  editor?: { setOption: (name: string, value: unknown) => void };
}

/** Cells and editors of ``widget`` read-only for the viewer, now and as cells arrive. */
export function lockDocument(widget: Widget): void {
  const content = (widget as Widget & { content?: IContentLike }).content;
  if (!content) {
    return;
  }
  widget.addClass('jp-gpulab-mod-readOnly');
  if (content.editor) {
    content.editor.setOption('readOnly', true);
  }
  if (!content.widgets) {
    return;
  }
  const lock = () => {
    for (const cell of content.widgets || []) {
      // Read-only here only: never written into the notebook's "editable" metadata.
      cell.syncEditable = false;
      cell.readOnly = true;
    }
  };
  lock();
  content.model?.cells?.changed.connect(lock);
}

/** A note in each launcher: why its tiles are not there. */
function noteInLaunchers(text: string): void {
  const add = () => {
    document.querySelectorAll('.jp-Launcher-content').forEach(content => {
      if (!content.querySelector('.jp-gpulab-LauncherNote')) {
        const note = document.createElement('p');
        note.className = 'jp-gpulab-LauncherNote';
        note.dataset.gpulab = 'launcher-note';
        note.textContent = text;
        content.insertBefore(note, content.firstChild);
      }
    });
  };
  add();
  new MutationObserver(add).observe(document.body, { childList: true, subtree: true });
}

/** Turn this JupyterLab into what a viewer can use. */
export function installViewerGuards(app: JupyterFrontEnd, options: IViewerOptions): void {
  const text = options.refusal || FALLBACK;
  const commands = app.commands;
  // One notice at a time: each refused action shows it afresh.
  let shown = '';
  const refuse = () => {
    if (shown) {
      Notification.dismiss(shown);
    }
    shown = Notification.warning(text, {
      autoClose: 10000,
      actions: [{ label: 'Save a copy', callback: options.saveCopy }]
    });
  };
  // Typing into a read-only cell or editor: told once, not at every key.
  let typedAt = 0;
  document.addEventListener(
    'beforeinput',
    event => {
      const target = event.target as Element | null;
      const now = Date.now();
      if (target?.closest?.('.jp-gpulab-mod-readOnly') && now - typedAt > 5000) {
        typedAt = now;
        refuse();
      }
    },
    true
  );
  const isEnabled = commands.isEnabled.bind(commands);
  commands.isEnabled = (id: string, args?: ReadonlyPartialJSONObject) =>
    !CHANGES.test(id) && isEnabled(id, args);
  const execute = commands.execute.bind(commands);
  commands.execute = (id: string, args?: ReadonlyPartialJSONObject) => {
    if (!CHANGES.test(id)) {
      return execute(id, args);
    }
    refuse();
    return Promise.resolve(undefined);
  };
  // Keys that lumino finds disabled are dropped without a word: say why instead.
  document.addEventListener(
    'keydown',
    event => {
      const key = event.key.toLowerCase();
      if ((event.ctrlKey || event.metaKey) && key === 's') {
        event.preventDefault();
        event.stopPropagation();
        refuse();
      }
    },
    true
  );
  noteInLaunchers(text);
}
