package io.unstall.flight.prep;

import static io.unstall.flight.prep.NativeJpegTest.BUDGET;
import static io.unstall.flight.prep.NativeJpegTest.ROOT;
import static io.unstall.flight.prep.NativeJpegTest.jpeg;
import static io.unstall.flight.prep.NativeJpegTest.rrc;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.cache.Digest;
import io.unstall.flight.prep.ImagePrep.Decoder;
import io.unstall.flight.prep.NativeJpegTest.Sampling;
import java.nio.ByteBuffer;
import java.util.SplittableRandom;
import org.apache.arrow.memory.BufferAllocator;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The decoded form (DecodedImages): prepared from kept pixels, a sample gets the same random draws and the same
 * tensor as from its encoded bytes: bit-exact where the kept image is full size (against the full decode) or at the
 * scale the encoded path picks for the crop; other crops are decoded from the encoded bytes.
 */
class DecodedImagesTest {
  @BeforeAll
  static void loaded() {
    NativeJpegTest.loaded();
  }

  /** The sample's tensor and the generator's next draw after it: the same draws, in the same order. */
  record Out(byte[] tensor, long nextDraw) {}

  static Out run(ImagePrep p, ByteBuffer img, long epoch, long id) throws Exception {
    ByteBuffer out = ByteBuffer.allocateDirect((int) p.pipeline().sampleBytes());
    SplittableRandom rng = ImagePrep.rng(7, epoch, id);
    p.run(img.duplicate(), Digest.of(img.duplicate()), rng, out);
    byte[] b = new byte[out.capacity()];
    out.get(b);
    return new Out(b, rng.nextLong());
  }

  @Test
  void aFullSizeKeptImageGivesTheEncodedPathsBytes() throws Exception {
    for (String dtype : new String[] {"uint8", "float32"}) {
      String pl = rrc(224, "[0.08,1.0]", "[0.75,1.3333333333333333]", dtype, "NCHW");
      try (BufferAllocator mem = ROOT.newChildAllocator("decoded-test", 0, 64L << 20);
          DecodedImages store = new DecodedImages(mem)) {
        ImagePrep kept = new ImagePrep(PrepPipeline.parse(pl), BUDGET, Decoder.NATIVE, null, store);
        ImagePrep full = NativeJpegTest.prep(pl, Decoder.NATIVE_FULL);
        for (int epoch = 0; epoch < 3; epoch++) {
          for (int i = 0; i < 8; i++) {
            ByteBuffer img = jpeg(500, 375, Sampling.values()[i % 4], 300 + i);
            assertEquals(1, DecodedImages.denom(ImageHeader.read(img), kept.pipeline()));
            Out a = run(kept, img, epoch, i);
            Out b = run(full, img, epoch, i);
            assertArrayEquals(b.tensor(), a.tensor(), dtype + " epoch " + epoch + " sample " + i);
            assertEquals(b.nextDraw(), a.nextDraw(), "the same draws");
          }
        }
        ObjectNode st = JsonNodeFactory.instance.objectNode();
        store.stats(st);
        assertEquals(8, st.get("made").asInt(), st.toString());
        assertEquals(8 * 3 - 8, st.get("hits").asInt(), st.toString()); // the first epoch decodes into the store
        assertEquals(8L * 500 * 375 * 3, st.get("bytes").asLong(), st.toString());
      }
    }
  }

  /**
   * A kept image at 1/d serves only the crops the encoded path decodes at 1/d (the same bytes); the others are
   * decoded from the encoded bytes. So every tensor equals the encoded path's, whichever form was there.
   */
  @Test
  void aReducedKeptImageServesTheCropsAtItsScaleAndEveryTensorIsTheEncodedPaths() throws Exception {
    int atItsScale = 0;
    int elsewhere = 0;
    for (int[] sz : new int[][] {{2001, 1501}, {1203, 901}}) {
      for (int out : new int[] {64, 96}) {
        String pl = rrc(out, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NHWC");
        for (Sampling s : Sampling.values()) {
          ByteBuffer img = jpeg(sz[0], sz[1], s, sz[0] * 17L + s.ordinal());
          ImageHeader h = ImageHeader.read(img);
          try (BufferAllocator mem = ROOT.newChildAllocator("decoded-test", 0, 64L << 20);
              DecodedImages store = new DecodedImages(mem)) {
            ImagePrep kept = new ImagePrep(PrepPipeline.parse(pl), BUDGET, Decoder.NATIVE, null, store);
            ImagePrep encoded = NativeJpegTest.prep(pl, Decoder.NATIVE);
            int d = DecodedImages.denom(h, kept.pipeline());
            assertTrue(d > 1, sz[0] + "x" + sz[1] + " -> " + out + " keeps a reduced image");
            // The kept image's shorter side serves the smallest crop's area at the output size.
            assertTrue(NativeJpeg.scaledSize(Math.min(sz[0], sz[1]), d) >= out / Math.sqrt(0.08));
            PrepPipeline.RandomResizedCrop c = (PrepPipeline.RandomResizedCrop) kept.pipeline().ops().get(1);
            for (int epoch = 0; epoch < 3; epoch++) {
              for (long id = 0; id < 20; id++) {
                Out a = run(kept, img, epoch, id);
                Out b = run(encoded, img, epoch, id);
                assertEquals(b.nextDraw(), a.nextDraw(), "the same draws");
                int[] r = SpatialOps.cropParams(h.height(), h.width(), c, ImagePrep.rng(7, epoch, id));
                int picked = NativeJpeg.scaleDenom(r[3], r[2], out, out, NativeJpeg.MAX_SCALE_DENOM,
                    NativeJpeg.REDUCING_GAP);
                assertArrayEquals(b.tensor(), a.tensor(), sz[0] + "x" + sz[1] + " " + s + " -> " + out + " epoch "
                    + epoch + " #" + id + " kept 1/" + d + " encoded 1/" + picked);
                if (picked == d) {
                  atItsScale++;
                } else {
                  elsewhere++;
                }
              }
            }
          }
        }
      }
    }
    assertTrue(atItsScale > 20 && elsewhere > 20, "at its scale " + atItsScale + ", elsewhere " + elsewhere);
  }

  @Test
  void theStoreKeepsImagesWithinItsQuotaAndPreparesTheRestFromTheEncodedBytes() throws Exception {
    String pl = rrc(224, "[0.08,1.0]", "[0.75,1.3333333333333333]", "uint8", "NCHW");
    long one = 500L * 375 * 3;
    try (BufferAllocator mem = ROOT.newChildAllocator("decoded-test", 0, 64L << 20);
        DecodedImages store = new DecodedImages(mem)) {
      store.quota(3 * one);
      ImagePrep kept = new ImagePrep(PrepPipeline.parse(pl), BUDGET, Decoder.NATIVE, null, store);
      ImagePrep full = NativeJpegTest.prep(pl, Decoder.NATIVE_FULL);
      ImagePrep encoded = NativeJpegTest.prep(pl, Decoder.NATIVE);
      for (int epoch = 0; epoch < 2; epoch++) {
        for (int i = 0; i < 6; i++) {
          ByteBuffer img = jpeg(500, 375, Sampling.S420, 500 + i);
          Out a = run(kept, img, epoch, i);
          Out ref = run(i < 3 ? full : encoded, img, epoch, i); // the first three are kept
          assertArrayEquals(ref.tensor(), a.tensor(), "epoch " + epoch + " sample " + i);
        }
      }
      ObjectNode st = JsonNodeFactory.instance.objectNode();
      store.stats(st);
      assertEquals(3, st.get("images").asInt(), st.toString());
      assertEquals(3, st.get("hits").asInt(), st.toString());
      assertEquals(6, st.get("no_room").asInt(), st.toString());
      assertTrue(mem.getAllocatedMemory() <= Slabs.SLAB, st.toString());
      double[] rates = kept.rates();
      assertTrue(rates[0] > 0 && rates[1] > 0, "both paths measured");
      assertEquals(one, rates[3], 0.0, "decoded bytes per sample");
    }
  }
}
