/** The benches' request images: some of the shared fixture photos as 1920x1080 JPEGs. */
import { join } from "node:path";
import { fixtureImagesDir } from "@trellis/testing";
import sharp from "sharp";

export const PHOTOS = ["chelsea.jpg", "coffee.jpg", "astronaut.jpg", "rocket.jpg", "camera.jpg", "motorcycle_left.jpg"];

/** The shared photos as 1920x1080 JPEGs (quality 90), like a camera frame. */
export async function fullHdPhotos(): Promise<Uint8Array[]> {
  return Promise.all(
    PHOTOS.map(
      async (p) =>
        new Uint8Array(
          await sharp(join(fixtureImagesDir, p)).resize(1920, 1080, { fit: "cover" }).jpeg({ quality: 90 }).toBuffer(),
        ),
    ),
  );
}
