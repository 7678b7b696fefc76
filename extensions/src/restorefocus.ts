/**
 * JupyterLab's layout restore never takes the tab a person is already working in.
 *
 * On a page load JupyterLab lets a person open documents while it still reopens the
 * tabs of their saved workspace, and a reopened notebook comes to the front by itself
 * once its file has loaded: a second or more after `app.restored`, right after a
 * project's restart. A notebook the person had just made from the Launcher then loses
 * its tab and its cursor to an older one, and the line they type goes nowhere (seen as
 * the first Shift+Enter after a project restart that ran nothing).
 *
 * Here, from the page's load until a while after the restore, the tab a person chose
 * (one that came to the front right after their click or key; text typed into a cell
 * chooses nothing) is brought back whenever another comes to the front with no click or
 * key of theirs. With no such choice the
 * restore's tabs stand, and after the window JupyterLab is left as it is.
 */
import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Widget } from '@lumino/widgets';

/** How long after `app.restored` reopened documents may still come to the front. */
export const SETTLE_MS = 20_000;

/** Whether ``widget`` is one of the main area's, still open. */
function openInMain(shell: ILabShell, widget: Widget): boolean {
  if (widget.isDisposed) {
    return false;
  }
  for (const w of shell.widgets('main')) {
    if (w === widget) {
      return true;
    }
  }
  return false;
}

/**
 * Whether ``event`` is text typed into an editor or a field: it writes there and never
 * brings another tab to the front (a click, a shortcut or a key elsewhere may).
 */
export function typing(event: Event): boolean {
  if (!(event instanceof KeyboardEvent) || event.ctrlKey || event.metaKey || event.altKey) {
    return false;
  }
  const target = event.target as HTMLElement | null;
  return (
    !!target &&
    (target.isContentEditable || target.tagName === 'INPUT' || target.tagName === 'TEXTAREA')
  );
}

/**
 * Keeps the person's chosen tab in front until ``settleMs`` after ``restored``;
 * resolves with how many times it brought it back.
 */
export async function keepChosenTab(
  shell: ILabShell,
  restored: Promise<unknown>,
  settleMs: number = SETTLE_MS,
  target: EventTarget = document
): Promise<number> {
  let acted = false; // a trusted click or key since the last change of tab
  let chosen: Widget | null = null;
  let broughtBack = 0;
  const onInput = (event: Event) => {
    if (event.isTrusted && !typing(event)) {
      acted = true;
    }
  };
  const onCurrent = (_: ILabShell, args: ILabShell.IChangedArgs) => {
    const person = acted;
    acted = false;
    if (person) {
      chosen = args.newValue;
      return;
    }
    const mine = chosen as Widget | null;
    if (mine && args.newValue !== mine && args.oldValue === mine && openInMain(shell, mine)) {
      broughtBack += 1;
      // after this change's other listeners (JupyterLab's own follow the current tab)
      setTimeout(() => {
        if (shell.currentWidget !== mine && openInMain(shell, mine) && !acted) {
          console.debug(`gpulab: ${mine.title.label} back in front of a reopened tab`);
          shell.activateById(mine.id);
        }
      }, 0);
    }
  };
  target.addEventListener('pointerdown', onInput, true);
  target.addEventListener('keydown', onInput, true);
  shell.currentChanged.connect(onCurrent);
  try {
    await restored;
  } catch {
    // a failed restore: the window still ends after settleMs
  }
  await new Promise(resolve => setTimeout(resolve, settleMs));
  target.removeEventListener('pointerdown', onInput, true);
  target.removeEventListener('keydown', onInput, true);
  shell.currentChanged.disconnect(onCurrent);
  return broughtBack;
}

const restoreFocus: JupyterFrontEndPlugin<void> = {
  id: 'gpulab-jupyter:restore-keeps-your-tab',
  description:
    'The tab you opened while JupyterLab reopens your workspace stays in front (a ' +
    'reopened notebook does not take it over).',
  autoStart: true,
  requires: [ILabShell],
  activate: (app: JupyterFrontEnd, shell: ILabShell): void => {
    void keepChosenTab(shell, app.restored);
  }
};

export default restoreFocus;
