/** The server's model loader: @trellis/ensemble-runner's repository scan and stage loader. */
import { connectRemote, loadStage, readEndpointsFile, scanRepository } from "@trellis/ensemble-runner";
import type { ModelLoader } from "./repository.js";

export function modelLoader(): ModelLoader {
  return { scanRepository, loadStage, connectRemote };
}

export const loadEndpoints = readEndpointsFile;
