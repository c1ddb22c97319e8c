/**
 * Triton's system shared memory extension: regions a client creates (POSIX
 * shared memory, which Linux keeps as files in /dev/shm) and registers by name,
 * then names in a request's input and output parameters instead of sending the
 * tensor bytes. Inputs are read from and outputs written to the region's file
 * (tmpfs: memory copies) at the region's offset plus the tensor's.
 */
import { closeSync, constants, fstatSync, openSync, readSync, writeSync } from "node:fs";
import { join } from "node:path";
import type { Parameters } from "@trellis/stage";
import { Code, StageError } from "@trellis/stage";

export interface SharedMemoryRegion {
  name: string;
  /** The shared memory object's key, as shm_open names it ("/input0"). */
  key: string;
  /** Where the region starts in the object, and its size, in bytes. */
  offset: number;
  byteSize: number;
}

/** A tensor's place in a region: the shared_memory_* parameters of an input or requested output. */
export interface SharedMemoryRef {
  region: string;
  offset: number;
  byteSize: number;
}

const invalid = (message: string) => new StageError(Code.InvalidArgument, "", message);

/** The shared_memory_* parameters of `tensor` (input or output), if it names a region; both name and size are needed. */
export function sharedMemoryRef(parameters: Parameters | undefined, tensor: string): SharedMemoryRef | undefined {
  const region = parameters?.shared_memory_region;
  const size = parameters?.shared_memory_byte_size;
  if (region === undefined && size === undefined) return undefined;
  if (typeof region !== "string" || size === undefined) {
    throw invalid(`${tensor}: shared_memory_region and shared_memory_byte_size go together`);
  }
  const byteSize = Number(size);
  const offset = Number(parameters?.shared_memory_offset ?? 0);
  if (!Number.isSafeInteger(byteSize) || byteSize < 0 || !Number.isSafeInteger(offset) || offset < 0) {
    throw invalid(`${tensor}: shared_memory_byte_size and shared_memory_offset must be byte counts`);
  }
  return { region, offset, byteSize };
}

/** Whether a tensor's parameters (wire or JSON) name a region: a look at two keys, before any converting. */
export function namesSharedMemory(parameters: object | undefined): boolean {
  return parameters !== undefined && ("shared_memory_region" in parameters || "shared_memory_byte_size" in parameters);
}

/** A request that names a region, on a server that takes none. */
export function sharedMemoryNotTaken(): StageError {
  return invalid(
    "the request names shared memory regions, but this server takes none: send the tensors in the request",
  );
}

/** What an answer's output written to `ref` carries instead of its bytes. */
export function sharedMemoryOutputParameters(ref: SharedMemoryRef, byteLength: number): Parameters {
  return {
    shared_memory_region: ref.region,
    shared_memory_byte_size: byteLength,
    ...(ref.offset ? { shared_memory_offset: ref.offset } : {}),
  };
}

/** `parameters` without the shared_memory_* ones (what the model should see), or undefined if none are left. */
export function withoutSharedMemory(parameters: Parameters | undefined): Parameters | undefined {
  if (!parameters) return undefined;
  const { shared_memory_region: _r, shared_memory_byte_size: _s, shared_memory_offset: _o, ...rest } = parameters;
  return Object.keys(rest).length > 0 ? rest : undefined;
}

/** Longest shared memory object name (NAME_MAX, as shm_open's). */
const MAX_OBJECT_NAME_BYTES = 255;

/**
 * Opens the shared memory object `key` names in `dir`, read-write, as glibc's shm_open does
 * (O_NOFOLLOW): the entry itself only, never what a symbolic link there points to, and only a
 * regular file (not a folder, a FIFO or a device, which O_NONBLOCK keeps from blocking the open).
 * A key names an object, never a path: nothing outside `dir` opens.
 */
function openObject(dir: string, key: string, fail: (why: string) => StageError): number {
  const object = key.startsWith("/") ? key.slice(1) : key;
  if (
    !object ||
    object.includes("/") ||
    object === "." ||
    object === ".." ||
    // biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it refuses
    /[\u0000-\u001f\u007f]/.test(object) ||
    Buffer.byteLength(object) > MAX_OBJECT_NAME_BYTES
  ) {
    throw fail(
      `key '${JSON.stringify(key).slice(1, -1)}' is not a shared memory object name ("/name", as shm_open takes it)`,
    );
  }
  // What shm_open cannot open (no such object; a symbolic link, which it does not follow; a folder)
  // is INTERNAL in Triton's words (its shared_memory_manager.cc), naming the key only.
  const unopenable = () => new StageError(Code.Internal, "", `Unable to open shared memory region: '${key}'`);
  let fd: number;
  try {
    fd = openSync(join(dir, object), constants.O_RDWR | constants.O_NOFOLLOW | constants.O_NONBLOCK);
  } catch {
    throw unopenable();
  }
  if (!fstatSync(fd).isFile()) {
    closeSync(fd);
    throw fail(`'${key}' is not a shared memory object: it is not a regular file`);
  }
  return fd;
}

/** The registered system shared memory regions of one server. */
export class SystemSharedMemory {
  private readonly regions = new Map<string, SharedMemoryRegion & { fd: number }>();

  /** @param dir where shared memory objects live (Linux: /dev/shm). */
  constructor(private readonly dir = "/dev/shm") {}

  register(name: string, key: string, offset: number, byteSize: number): void {
    const fail = (why: string) => invalid(`failed to register system shared memory region '${name}': ${why}`);
    if (!name) throw fail("the region needs a name");
    // Triton's check of the key (common.cc ValidateSharedMemoryKey): one of only slashes, or none, names nothing.
    if (/^\/*$/.test(key)) throw invalid(`cannot register shared memory region '${name}' - invalid shm key '${key}'`);
    if (this.regions.has(name)) {
      throw new StageError(Code.AlreadyExists, "", `shared memory region '${name}' already in manager`);
    }
    const fd = openObject(this.dir, key, fail);
    const size = fstatSync(fd).size;
    if (offset + byteSize > size) {
      closeSync(fd);
      // Triton's words first (CheckSharedMemoryRegionSize), then which bounds.
      throw invalid(
        `failed to register shared memory region '${name}': invalid args (offset ${offset} + byte_size ${byteSize} runs past the ${size} bytes of '${key}')`,
      );
    }
    this.regions.set(name, { name, key, offset, byteSize, fd });
  }

  /** Unregisters `name`, or every region when it is empty; a name not registered is not an error, as in Triton. */
  unregister(name = ""): void {
    for (const [n, r] of this.regions) {
      if (name && n !== name) continue;
      closeSync(r.fd);
      this.regions.delete(n);
    }
  }

  /** Every region, or the one named (NOT_FOUND if it is not registered). */
  status(name = ""): SharedMemoryRegion[] {
    const all = [...this.regions.values()].map(({ fd: _fd, ...r }) => r);
    if (!name) return all;
    const one = all.filter((r) => r.name === name);
    if (one.length === 0)
      throw new StageError(Code.NotFound, "", `Unable to find system shared memory region: '${name}'`);
    return one;
  }

  private place(ref: SharedMemoryRef, tensor: string) {
    const r = this.regions.get(ref.region);
    if (!r) throw invalid(`${tensor}: Unable to find shared memory region: '${ref.region}'`);
    if (ref.offset + ref.byteSize > r.byteSize) {
      throw invalid(
        `${tensor}: invalid offset + byte size for shared memory region '${ref.region}' (${ref.offset} + ${ref.byteSize} > ${r.byteSize})`,
      );
    }
    return { fd: r.fd, position: r.offset + ref.offset };
  }

  /** An input's bytes from its region. */
  read(ref: SharedMemoryRef, tensor: string): Uint8Array {
    const { fd, position } = this.place(ref, tensor);
    const bytes = new Uint8Array(ref.byteSize);
    let done = 0;
    while (done < bytes.byteLength) {
      const n = readSync(fd, bytes, done, bytes.byteLength - done, position + done);
      if (n === 0) throw invalid(`${tensor}: shared memory region '${ref.region}' ended early`);
      done += n;
    }
    return bytes;
  }

  /** An output's bytes into its region; they must fit in the byte size the request gave. */
  write(ref: SharedMemoryRef, bytes: Uint8Array, tensor: string): void {
    if (bytes.byteLength > ref.byteSize) {
      throw invalid(
        `${tensor}: shared_memory_byte_size ${ref.byteSize} is too small for the output's ${bytes.byteLength} bytes`,
      );
    }
    const { fd, position } = this.place(ref, tensor);
    let done = 0;
    while (done < bytes.byteLength) done += writeSync(fd, bytes, done, bytes.byteLength - done, position + done);
  }

  close(): void {
    this.unregister();
  }
}
