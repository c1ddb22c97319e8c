/**
 * tritonserver flags that a Triton command line carries but that mean nothing
 * in this server (GPU memory pools, thread counts, plugin directories). They are
 * accepted, so a pasted `tritonserver ...` line starts, and each one given is
 * named in a warning at start saying why it has no effect. Values that would ask
 * for behaviour this server does not have (model namespacing, a shared port) are
 * refused instead: starting without them would mislead.
 */
import { type Command, InvalidArgumentError, Option } from "commander";

interface CompatFlag {
  /** The flag, as tritonserver spells it (without "--"). */
  name: string;
  /** Its argument, as --help shows it. */
  arg: string;
  /**
   * Why it has no effect here. A function decides per value: a string warns,
   * undefined accepts silently (a value asking for what the server does anyway),
   * and `refuse` stops the server at start.
   */
  why: string | ((value: string) => string | undefined | { refuse: string });
}

const NO_CUDA =
  "this server allocates no GPU memory (the GPU path is a Triton server that the TensorRT bridge calls; set it there)";
const EVENT_LOOP = "requests are served by Node's event loop, with no such threads or pools to size";
const isTrue = (value: string) => ["true", "1", "on", "yes"].includes(value.toLowerCase());

/** A boolean flag whose false is what this server does anyway, and whose true it cannot do. */
function refusedWhenTrue(name: string, why: string): CompatFlag {
  return { name, arg: "[bool]", why: (v) => (isTrue(v) ? { refuse: `--${name}: ${why}` } : undefined) };
}

const COMPAT_FLAGS: CompatFlag[] = [
  { name: "pinned-memory-pool-byte-size", arg: "<bytes>", why: NO_CUDA },
  { name: "cuda-memory-pool-byte-size", arg: "<gpu>:<bytes>", why: NO_CUDA },
  { name: "cuda-virtual-address-size", arg: "<gpu>:<bytes>", why: NO_CUDA },
  { name: "min-supported-compute-capability", arg: "<cc>", why: NO_CUDA },
  { name: "model-load-gpu-limit", arg: "<gpu>:<fraction>", why: NO_CUDA },
  {
    name: "backend-directory",
    arg: "<path>",
    why: "backends (onnxruntime, typescript, ensemble) are built in; none is loaded from a directory",
  },
  { name: "repoagent-directory", arg: "<path>", why: "this server has no repository agents" },
  { name: "cache-directory", arg: "<path>", why: "the local response cache is built in (--cache-config local,size=)" },
  { name: "buffer-manager-thread-count", arg: "<n>", why: EVENT_LOOP },
  { name: "http-thread-count", arg: "<n>", why: EVENT_LOOP },
  { name: "grpc-infer-allocation-pool-size", arg: "<n>", why: EVENT_LOOP },
  { name: "sagemaker-thread-count", arg: "<n>", why: EVENT_LOOP },
  { name: "vertex-ai-thread-count", arg: "<n>", why: EVENT_LOOP },
  {
    name: "sagemaker-safe-port-range",
    arg: "<start>-<end>",
    why: "the other listeners' ports are not checked against a SageMaker range here",
  },
  { name: "host-policy", arg: "<name>,<setting>=<value>", why: "this server has no host policies (NUMA binding)" },
  refusedWhenTrue("reuse-http-port", "sharing a port needs Node 22's reusePort"),
  refusedWhenTrue("reuse-grpc-port", "sharing a port needs Node 22's reusePort"),
  refusedWhenTrue("model-namespacing", "models are named without namespaces here; names must be unique"),
];

/** Commander's key for a flag: "--cuda-memory-pool-byte-size" -> "cudaMemoryPoolByteSize". */
const keyOf = (name: string) => name.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/**
 * Adds the flags to `program`, hidden from the option list (they would drown the ones that
 * do something) and listed after it instead. Every value is kept, as text, to judge at start.
 */
export function addCompatFlags(program: Command): Command {
  for (const { name, arg } of COMPAT_FLAGS) {
    const option = new Option(`--${name} ${arg}`).hideHelp();
    if (arg === "[bool]") {
      // Alone it means true, as tritonserver's boolean flags.
      option.argParser((v: string, prev: string[] = []) => {
        if (!["true", "false", "1", "0", "on", "off", "yes", "no"].includes(v.toLowerCase()))
          throw new InvalidArgumentError("true or false");
        return [...prev, v];
      });
      option.preset("true");
    } else {
      option.argParser((v: string, prev: string[] = []) => [...prev, v]);
    }
    program.addOption(option);
  }
  return program.addHelpText(
    "after",
    `\ntritonserver flags accepted so a Triton command line runs, though they have no effect here:\na warning at start names each one given and why. Values asking for what this server lacks\n(a port shared, model namespacing) stop it at start instead,\nsaying so.\n${COMPAT_FLAGS.map(({ name, arg }) => `  --${name} ${arg}`).join("\n")}\n`,
  );
}

/** A warning for each compatibility flag given; a value this server cannot honour throws `refuse`'s message. */
export function compatWarnings(opts: Record<string, unknown>, refuse: (message: string) => Error): string[] {
  const warnings: string[] = [];
  for (const { name, why } of COMPAT_FLAGS) {
    const values = opts[keyOf(name)] as string[] | undefined;
    for (const value of values ?? []) {
      const verdict = typeof why === "string" ? why : why(value);
      if (verdict === undefined) continue;
      if (typeof verdict === "object") throw refuse(verdict.refuse);
      warnings.push(`--${name}=${value} has no effect: ${verdict}`);
    }
  }
  return warnings;
}
