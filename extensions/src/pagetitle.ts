/**
 * The browser tab says which project it is: "Untitled.ipynb — Alice First — gpulab"
 * rather than JupyterLab's "Untitled.ipynb - JupyterLab". JupyterLab writes the title
 * itself whenever the current document changes; each of its titles is rewritten here.
 */
import { PageConfig } from '@jupyterlab/coreutils';

/** JupyterLab's title (`<document> - JupyterLab`, or `JupyterLab`) for ``project``. */
export function projectTitle(title: string, project: string, appName: string): string {
  const suffix = `— ${project} — gpulab`;
  // Already this project's (with a document, or the project's alone): rewriting the
  // project's own title again would name the project twice.
  if (title.endsWith(suffix) || title === `${project} — gpulab`) {
    return title;
  }
  let doc = title.trim();
  for (const end of [` - ${appName}`, appName]) {
    if (doc.endsWith(end)) {
      doc = doc.slice(0, -end.length).trim();
      break;
    }
  }
  return doc ? `${doc} ${suffix}` : `${project} — gpulab`;
}

/** Keeps the page's title naming ``project`` (a display name); returns the observer. */
export function nameProjectInTitle(project: string): MutationObserver | null {
  const head = document.querySelector('title') || document.head;
  if (!project || !head) {
    return null;
  }
  const appName = PageConfig.getOption('appName') || 'JupyterLab';
  const update = () => {
    const next = projectTitle(document.title, project, appName);
    if (next !== document.title) {
      document.title = next;
    }
  };
  const observer = new MutationObserver(update);
  observer.observe(head, { childList: true, characterData: true, subtree: true });
  update();
  return observer;
}
