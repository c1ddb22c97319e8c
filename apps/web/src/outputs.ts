/** Reading a classifier's answer: BYTES elements, and a top-5 out of the strings they hold. */

export interface Label {
  label: string;
  prob: number;
}

/** One top-5 from an output string: the seed's JSON ({top5_labels, top5_probs}) or "score:index:label" strings. */
export function labelsOf(strings: string[]): Label[] {
  const first = strings[0]?.trim() ?? "";
  if (strings.length === 1 && first.startsWith("{")) {
    const j = JSON.parse(first) as { top5_labels?: unknown; top5_probs?: unknown };
    const { top5_labels: labels, top5_probs: probs } = j;
    if (Array.isArray(labels) && Array.isArray(probs)) {
      return labels.map((label, i) => ({ label: String(label), prob: Number(probs[i]) }));
    }
    throw new Error("the output is JSON without top5_labels and top5_probs");
  }
  return strings.map((s) => {
    const [score = "", index = "", ...label] = s.split(":");
    return { label: label.length > 0 ? label.join(":") : index, prob: Number(score) };
  });
}

/** A BYTES tensor's elements, each a 4-byte little-endian length and its bytes. */
export function bytesElements(raw: Uint8Array): string[] {
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const decoder = new TextDecoder();
  const out: string[] = [];
  for (let at = 0; at + 4 <= raw.length; ) {
    const n = view.getUint32(at, true);
    out.push(decoder.decode(raw.subarray(at + 4, at + 4 + n)));
    at += 4 + n;
  }
  return out;
}
