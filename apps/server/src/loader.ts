/** The server's model loader: @trellis/ensemble-runner's repository scan and stage loader. */
import { connectRemote, loadStage, readEndpointsFile, scanRepository } from "@trellis/ensemble-runner";
import type { GrpcTlsOptions } from "@trellis/stage";
import type { ModelLoader } from "./repository.js";

/** `remoteTls`: how to reach https:// --endpoints (the CA to trust, a client certificate). */
export function modelLoader(remoteTls?: GrpcTlsOptions): ModelLoader {
  return {
    scanRepository,
    loadStage: (model, options) => loadStage(model, { ...options, remoteTls }),
    connectRemote: (name, url, version) => connectRemote(name, url, version, remoteTls),
  };
}

export const loadEndpoints = readEndpointsFile;
