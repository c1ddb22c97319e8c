import { bytesTensor, type Stage } from "@trellis/stage";

/** One request of `items` as RAW_IMAGE [N,1]. */
export function rawImageRequest(items: (Uint8Array | string)[]) {
  return { inputs: [bytesTensor("RAW_IMAGE", [items.length, 1], items)] };
}

export async function preprocessOne(stage: Stage, item: Uint8Array | string): Promise<Float32Array> {
  const res = await stage.infer(rawImageRequest([item]));
  return res.outputs[0]!.data as Float32Array;
}

export function diff(a: ArrayLike<number>, b: ArrayLike<number>): { max: number; mean: number } {
  if (a.length !== b.length) throw new Error(`length ${a.length} vs ${b.length}`);
  let max = 0;
  let sum = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs((a[i] as number) - (b[i] as number));
    sum += d;
    if (d > max) max = d;
  }
  return { max, mean: sum / a.length };
}
