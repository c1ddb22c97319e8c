/**
 * Text formatting that reproduces the seed's Python output byte for byte:
 * `json.dumps` (default separators, ensure_ascii) of Python floats, and
 * C's `%f` for Triton's classification strings.
 */

/**
 * Python's `repr(float)`: the shortest round-tripping digits (which is what
 * JS's Number formatting also produces), laid out by CPython's rules:
 * exponent form when the decimal point position is <= -4 or > 16, a
 * two-digit signed exponent, and ".0" on integral values.
 */
export function pyFloatRepr(x: number): string {
  // json.dumps writes these (allow_nan=True); the stage never emits them.
  if (Number.isNaN(x)) return "NaN";
  if (x === Number.POSITIVE_INFINITY) return "Infinity";
  if (x === Number.NEGATIVE_INFINITY) return "-Infinity";
  if (x === 0) return Object.is(x, -0) ? "-0.0" : "0.0";
  const sign = x < 0 ? "-" : "";
  const [mantissa = "", expText = "0"] = Math.abs(x).toExponential().split("e");
  const digits = mantissa.replace(".", "");
  const exp = Number(expText);
  // CPython's `decpt`: value = 0.d1d2... * 10^decpt
  const decpt = exp + 1;
  if (decpt <= -4 || decpt > 16) {
    const m = digits.length > 1 ? `${digits[0]}.${digits.slice(1)}` : digits;
    return `${sign}${m}e${exp < 0 ? "-" : "+"}${String(Math.abs(exp)).padStart(2, "0")}`;
  }
  if (decpt <= 0) return `${sign}0.${"0".repeat(-decpt)}${digits}`;
  if (decpt >= digits.length) return `${sign}${digits}${"0".repeat(decpt - digits.length)}.0`;
  return `${sign}${digits.slice(0, decpt)}.${digits.slice(decpt)}`;
}

const SHORT_ESCAPES: Record<number, string> = {
  34: '\\"',
  92: "\\\\",
  10: "\\n",
  13: "\\r",
  9: "\\t",
  8: "\\b",
  12: "\\f",
};

/**
 * A JSON string literal as Python's json.dumps writes it with the default
 * ensure_ascii=True: everything outside printable ASCII becomes \uXXXX
 * (lowercase hex, UTF-16 code units, so astral characters become surrogate
 * pairs exactly as Python writes them).
 */
export function pyJsonString(s: string): string {
  let out = '"';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    const short = SHORT_ESCAPES[c];
    if (short !== undefined) out += short;
    else if (c >= 0x20 && c <= 0x7e) out += s[i];
    else out += `\\u${c.toString(16).padStart(4, "0")}`;
  }
  return `${out}"`;
}

/** `json.dumps(list_of_str)`. */
export function pyJsonStringList(items: readonly string[]): string {
  return `[${items.map(pyJsonString).join(", ")}]`;
}

/** `json.dumps(list_of_float)`. */
export function pyJsonFloatList(items: readonly number[]): string {
  return `[${items.map(pyFloatRepr).join(", ")}]`;
}

/**
 * C's `%f` (what `std::to_string(float)` produces in Triton's
 * classification output): fixed, 6 decimals. toFixed rounds the exact
 * binary value like glibc does except on exact decimal ties, which a
 * float with 6+ fractional decimals cannot hit at the 7th digit.
 */
export function cFixed6(x: number): string {
  if (Number.isNaN(x)) return "nan";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const s = x.toFixed(6);
  // toFixed drops the sign of values that round to zero; printf keeps it.
  return x < 0 && !s.startsWith("-") ? `-${s}` : s;
}
