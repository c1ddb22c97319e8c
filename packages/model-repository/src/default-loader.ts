/** The loader a repository manager uses unless told otherwise: this package's scan and stage loader. */

import type { GrpcTlsOptions } from "@trellis/kserve";
import { loadStage } from "./loader.js";
import type { ModelLoader } from "./manager-options.js";
import { connectRemote, type RemoteOptions } from "./remote.js";
import { scanRepository } from "./scan.js";

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
