/**
 * BYTES elements kept as they arrived: one buffer in KServe's framing (each
 * element a 4-byte little-endian length, then its bytes) behind an array of
 * `Uint8Array` elements. A tensor of ten million short strings is then one
 * buffer, not ten million objects of ~100 bytes each: the server passes it
 * from the wire to ONNX Runtime and back without touching its elements.
 *
 * It is still a `Uint8Array[]` to everyone else (`Array.isArray`, indexing,
 * `length`, `map`, iteration, `JSON.stringify`): an element is made, as a view
 * into the buffer, when read. The first write turns it into a plain array of
 * those views, so code that edits its tensor's data keeps working.
 */

const FRAME_PREFIX_BYTES = 4;

interface Packing {
  framed: Uint8Array;
  count: number;
  /** Where each element's length prefix starts; built on the first element read. */
  starts?: Float64Array | Uint32Array;
  /** Set once written to: from then on the array itself holds the elements. */
  unpacked: boolean;
}

const packings = new WeakMap<object, Packing>();

/** Why a buffer is not well framed: where, and what went wrong there. */
export interface FramingProblem {
  /** The element whose prefix or bytes are wrong. */
  index: number;
  /** "prefix": fewer than 4 bytes left for its length; "overrun": its length runs past the end. */
  kind: "prefix" | "overrun";
  /** Bytes left after the prefix ("overrun") or at it ("prefix"). */
  remaining: number;
  message: string;
}

/**
 * The number of elements in `framed` (KServe BYTES framing), or why it is not
 * well framed: a length prefix cut short, or an element running past the end.
 * Reads the prefixes only; allocates nothing unless it fails.
 */
export function countFramedElements(framed: Uint8Array): number | FramingProblem {
  const view = new DataView(framed.buffer, framed.byteOffset, framed.byteLength);
  const end = framed.byteLength;
  let offset = 0;
  let count = 0;
  while (offset < end) {
    if (end - offset < FRAME_PREFIX_BYTES) {
      const remaining = end - offset;
      const message = `BYTES element ${count}: truncated length prefix at byte ${offset} (${remaining} of 4 bytes)`;
      return { index: count, kind: "prefix", remaining, message };
    }
    const length = view.getUint32(offset, true);
    offset += FRAME_PREFIX_BYTES;
    if (length > end - offset) {
      const remaining = end - offset;
      const message = `BYTES element ${count}: length ${length} at byte ${offset - FRAME_PREFIX_BYTES} runs past the end (${remaining} bytes left)`;
      return { index: count, kind: "overrun", remaining, message };
    }
    offset += length;
    count++;
  }
  return count;
}

function startsOf(p: Packing): Float64Array | Uint32Array {
  if (p.starts) return p.starts;
  const { framed, count } = p;
  const starts = framed.byteLength < 2 ** 32 ? new Uint32Array(count) : new Float64Array(count);
  const view = new DataView(framed.buffer, framed.byteOffset, framed.byteLength);
  let offset = 0;
  for (let i = 0; i < count; i++) {
    starts[i] = offset;
    offset += FRAME_PREFIX_BYTES + view.getUint32(offset, true);
  }
  p.starts = starts;
  return starts;
}

function elementAt(p: Packing, index: number): Uint8Array {
  const start = startsOf(p)[index]! + FRAME_PREFIX_BYTES;
  const { framed } = p;
  const length =
    framed[start - 4]! | (framed[start - 3]! << 8) | (framed[start - 2]! << 16) | (framed[start - 1]! << 24);
  return framed.subarray(start, start + (length >>> 0));
}

/** The element index `key` names (a canonical array index below `count`), else -1. */
function indexOf(key: string | symbol, count: number): number {
  if (typeof key !== "string" || key.length === 0 || key.length > 16) return -1;
  const n = Number(key);
  return Number.isInteger(n) && n >= 0 && n < count && String(n) === key ? n : -1;
}

/** Fills the array with its elements as views, so it no longer needs its packing. */
function unpack(target: Uint8Array[], p: Packing): void {
  if (p.unpacked) return;
  for (let i = 0; i < p.count; i++) target[i] = elementAt(p, i);
  p.unpacked = true;
}

function handlerOf(p: Packing): ProxyHandler<Uint8Array[]> {
  return {
    get(target, key, receiver) {
      if (p.unpacked) return Reflect.get(target, key, receiver);
      if (key === "length") return p.count;
      const i = indexOf(key, p.count);
      return i >= 0 ? elementAt(p, i) : Reflect.get(target, key, receiver);
    },
    has(target, key) {
      if (p.unpacked) return Reflect.has(target, key);
      return indexOf(key, p.count) >= 0 || Reflect.has(target, key);
    },
    getOwnPropertyDescriptor(target, key) {
      if (p.unpacked) return Reflect.getOwnPropertyDescriptor(target, key);
      if (key === "length") return { value: p.count, writable: true, enumerable: false, configurable: false };
      const i = indexOf(key, p.count);
      if (i >= 0) return { value: elementAt(p, i), writable: true, enumerable: true, configurable: true };
      return Reflect.getOwnPropertyDescriptor(target, key);
    },
    ownKeys(target) {
      if (p.unpacked) return Reflect.ownKeys(target);
      return [...Array.from({ length: p.count }, (_, i) => String(i)), ...Reflect.ownKeys(target)];
    },
    set(target, key, value) {
      unpack(target, p);
      return Reflect.set(target, key, value);
    },
    defineProperty(target, key, descriptor) {
      unpack(target, p);
      return Reflect.defineProperty(target, key, descriptor);
    },
    deleteProperty(target, key) {
      unpack(target, p);
      return Reflect.deleteProperty(target, key);
    },
  };
}

/**
 * The `count` elements framed in `framed` (KServe BYTES framing) as an array
 * that keeps them in that one buffer (a view: not copied). The caller has
 * checked the framing (countFramedElements).
 */
export function packedBytes(framed: Uint8Array, count: number): Uint8Array[] {
  const p: Packing = { framed, count, unpacked: false };
  const proxy = new Proxy<Uint8Array[]>([], handlerOf(p));
  packings.set(proxy, p);
  return proxy;
}

/**
 * Below this many elements a BYTES tensor is a plain array of views: for a request's image or
 * two, the proxy would cost more on every read than the few objects it saves.
 */
export const PACKED_MIN_ELEMENTS = 256;

/**
 * The `count` elements framed in `framed`, as views into it (not copied): packed behind one
 * array (packedBytes) when there are many, a plain array when there are few. The caller has
 * checked the framing (countFramedElements).
 */
export function framedElements(framed: Uint8Array, count: number): Uint8Array[] {
  if (count >= PACKED_MIN_ELEMENTS) return packedBytes(framed, count);
  const p: Packing = { framed, count, unpacked: false };
  return Array.from({ length: count }, (_, i) => elementAt(p, i));
}

/**
 * The framed buffer behind `items` when they are still packed (packedBytes,
 * never written to), else undefined: the elements in KServe's BYTES framing
 * without touching them one by one.
 */
export function framedBytesOf(items: readonly Uint8Array[]): Uint8Array | undefined {
  const p = packings.get(items);
  return p && !p.unpacked ? p.framed : undefined;
}

/**
 * `items` in KServe's BYTES framing: the buffer behind them when packed
 * (not copied), else a new buffer.
 */
export function frameElements(items: readonly Uint8Array[]): Uint8Array {
  const packed = framedBytesOf(items);
  if (packed) return packed;
  let total = 0;
  for (const b of items) total += FRAME_PREFIX_BYTES + b.byteLength;
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  let offset = 0;
  for (const b of items) {
    view.setUint32(offset, b.byteLength, true);
    out.set(b, offset + FRAME_PREFIX_BYTES);
    offset += FRAME_PREFIX_BYTES + b.byteLength;
  }
  return out;
}
