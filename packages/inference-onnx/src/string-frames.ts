/**
 * String tensors cross to and from the session worker as one buffer in
 * KServe's BYTES framing (a 4-byte little-endian length, then the UTF-8
 * bytes, per element), not as an array of strings: posting ten million
 * strings clones ten million objects, and one buffer moves for free. The
 * worker turns it into the string[] ONNX Runtime takes, and back.
 *
 * Most string elements are short ASCII (tokens, labels, ids): those are built
 * and written byte by byte here, which is several times faster than a native
 * UTF-8 call per element; anything else goes through Buffer's UTF-8 codec.
 */

/** Elements up to this many bytes are tried as ASCII in JavaScript first. */
const SHORT_ELEMENT_BYTES = 8;

const readLength = (b: Uint8Array, o: number) =>
  (b[o]! | (b[o + 1]! << 8) | (b[o + 2]! << 16) | (b[o + 3]! << 24)) >>> 0;

/** The `count` strings framed in `framed` (UTF-8; invalid sequences read as U+FFFD). */
export function stringsFromFrames(framed: Uint8Array, count: number): string[] {
  const buffer = Buffer.from(framed.buffer, framed.byteOffset, framed.byteLength);
  const out = new Array<string>(count);
  let offset = 0;
  for (let i = 0; i < count; i++) {
    const length = readLength(buffer, offset);
    offset += 4;
    let text: string | undefined;
    if (length <= SHORT_ELEMENT_BYTES) {
      text = "";
      for (let k = 0; k < length; k++) {
        const c = buffer[offset + k]!;
        if (c > 0x7f) {
          text = undefined;
          break;
        }
        text += String.fromCharCode(c);
      }
    }
    out[i] = text ?? buffer.toString("utf8", offset, offset + length);
    offset += length;
  }
  return out;
}

/** `items` framed (UTF-8) in one new buffer. */
export function framesFromStrings(items: readonly string[]): Uint8Array {
  let asciiBytes = 0;
  for (const s of items) asciiBytes += 4 + s.length;
  // allocUnsafeSlow: a buffer of its own (never the shared pool), as it is transferred to the main thread.
  const out = Buffer.allocUnsafeSlow(asciiBytes);
  let offset = 0;
  for (const s of items) {
    const n = s.length;
    for (let k = 0; k < n; k++) {
      const c = s.charCodeAt(k);
      if (c > 0x7f) return framesFromUtf8(items);
      out[offset + 4 + k] = c;
    }
    out.writeUInt32LE(n, offset);
    offset += 4 + n;
  }
  return out;
}

function framesFromUtf8(items: readonly string[]): Uint8Array {
  let total = 0;
  for (const s of items) total += 4 + Buffer.byteLength(s);
  const out = Buffer.allocUnsafeSlow(total);
  let offset = 0;
  for (const s of items) {
    const n = out.write(s, offset + 4);
    out.writeUInt32LE(n, offset);
    offset += 4 + n;
  }
  return out;
}
