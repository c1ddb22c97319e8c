import { Code } from "@connectrpc/connect";
import { StageError } from "@trellis/stage";
import { describe, expect, it } from "vitest";
import { clientError, clientMessage } from "../src/client-errors.js";

describe("clientMessage", () => {
  it("shortens the server's paths to their last segment and withholds URLs, addresses and stack frames", () => {
    expect(
      clientMessage(
        "m: cannot import file:///srv/repo/m/1/missing.js: Cannot find module '/srv/repo/m/1/missing.js' imported from /opt/trellis/packages/ensemble-runner/dist/loader.js",
      ),
    ).toBe("m: cannot import missing.js: Cannot find module 'missing.js' imported from loader.js");
    expect(clientMessage("onnxruntime could not load /tmp/trellis-load-Ab12/m/1/model.onnx: failed")).toBe(
      "onnxruntime could not load model.onnx: failed",
    );
    expect(clientMessage("/srv/repo/m/config.pbtxt:3:17: expected an integer")).toBe(
      "config.pbtxt:3:17: expected an integer",
    );
    expect(clientMessage("remote model r at http://10.0.0.7:8001: connect ECONNREFUSED 10.0.0.7:8001")).toBe(
      "remote model r: connect ECONNREFUSED <address>",
    );
    expect(
      clientMessage("remote model r at https://triton.internal:8001/: getaddrinfo ENOTFOUND triton.internal"),
    ).toBe("remote model r: getaddrinfo ENOTFOUND <address>");
    expect(clientMessage("reached [::1]:8001 and localhost:9000")).toBe("reached <address> and <address>");
    expect(clientMessage("at [fe80::1] and [2001:db8::7]:8001")).toBe("at <address> and <address>");
    expect(clientMessage("boom\n    at f (/x/y.js:1:2)\n    at g (node:internal/x:3:4)")).toBe("boom");
  });

  it("leaves what a client sent and relative paths alone", () => {
    for (const text of [
      "input 'INPUT': shape [1,4] needs 4 elements, got 3",
      "file override 'file:1/model.onnx' must be a path inside the model's folder",
      "FP32/FP16 mismatch in 1/model.onnx",
      "shared memory key '/shm-key' is not registered",
      "key '/../../etc/passwd' is not a shared memory object name",
      "expected OFF, TIMESTAMPS or TENSORS",
      // Shapes of one number look like bracketed addresses, but an IPv6 address has colons.
      "unexpected shape for input 'RAW_IMAGE' for model 'resnet50_ensemble'. Expected [-1,1], got [2]",
      "got [1024] and [ab]",
    ]) {
      expect(clientMessage(text)).toBe(text);
    }
  });

  it("keeps an error's code; an error with nothing to withhold is the same error, a withheld detail is reported", () => {
    const plain = new StageError(Code.InvalidArgument, "m", "bad input");
    expect(clientError(plain)).toBe(plain);
    const details: string[] = [];
    const leaky = new StageError(Code.Unavailable, "m", "remote model m at http://10.0.0.7:8001: gone");
    const sent = clientError(leaky, (detail, message) => details.push(detail, message));
    expect(sent.code).toBe(Code.Unavailable);
    expect(sent.rawMessage).toBe("m: remote model m: gone");
    expect(details).toEqual(["m: remote model m at http://10.0.0.7:8001: gone", "m: remote model m: gone"]);
    expect(clientError(new TypeError("x of /srv/a/b")).code).toBe(Code.Internal);
  });
});
