/** What one plugin of the extension hands another. */
import { Token } from '@lumino/coreutils';

import { GpuModel } from './model';

/** The GPU status this tab polls (the status bar's): the Jobs panel shows it on running jobs. */
export const IGpuStatus = new Token<GpuModel>(
  'gpulab-jupyter:IGpuStatus',
  "The GPU status of this project's container, as polled for the status bar."
);
