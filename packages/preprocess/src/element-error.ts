/** Why one element was rejected; the stage prefixes the element index. */
export class ElementError extends Error {
  override name = "ElementError";
}

/** Refuses an image larger than max_pixels; called with the header's size, before any pixel buffer exists. */
export function checkPixels(width: number, height: number, maxPixels: number): void {
  if (width * height > maxPixels) {
    throw new ElementError(
      `${width}x${height} = ${width * height} pixels exceed max_pixels ${maxPixels} (rejected before decoding)`,
    );
  }
}

/** A decoded image: `width * height` pixels, RGB, 8 bits a channel, rows top to bottom. */
export interface RgbImage {
  width: number;
  height: number;
  rgb: Uint8Array;
}
