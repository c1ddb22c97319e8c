/** The server's model loader: @trellis/ensemble-runner's repository scan and stage loader. */

import type { GrpcTlsOptions } from "@trellis/kserve";
import { connectRemote, loadStage, type RemoteOptions, readEndpointsFile, scanRepository } from "@trellis/model-loader";
import type { ModelLoader } from "./repository.js";

/**
 * `remoteTls`: how to reach https:// --endpoints (the CA to trust, a client certificate);
 * `remote`: their calls' deadline and keepalive (--endpoints-timeout-secs, --endpoints-keepalive-*).
 */
export function modelLoader(remoteTls?: GrpcTlsOptions, remote?: RemoteOptions): ModelLoader {
  return {
    scanRepository,
    loadStage: (model, options) => loadStage(model, { ...options, remoteTls, ...(remote ? { remote } : {}) }),
    connectRemote: (name, url, version) => connectRemote(name, url, version, remoteTls, remote),
  };
}

export const loadEndpoints = readEndpointsFile;
