package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.prep.PrepPipeline.CenterCrop;
import io.unstall.flight.prep.PrepPipeline.HFlip;
import io.unstall.flight.prep.PrepPipeline.RandomResizedCrop;
import io.unstall.flight.prep.PrepPipeline.Resize;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.util.SplittableRandom;
import org.junit.jupiter.api.Test;

/**
 * protocol/fixtures/draws-v1.json, which the shim's {@code unstall.prep.draws} (the GPU decode path's crops) also
 * gives: the window, output size and flip the sidecar's ops draw for a sample of an epoch, walked as the CPU paths
 * walk them ({@link ImagePrep#rng}, {@link SpatialOps}, hflip's one {@code nextDouble}).
 */
class SpatialOpsTest {
  private static final ObjectMapper JSON = new ObjectMapper();

  @Test
  void theSidecarsDrawsAreTheGoldenFixturesBoxes() throws Exception {
    JsonNode cases = JSON.readTree(ProtocolFixturesTest.FIXTURES.resolve("draws-v1.json").toFile()).get("cases");
    int checked = 0;
    for (JsonNode c : cases) {
      ObjectNode doc = JSON.createObjectNode();
      doc.set("ops", c.get("ops"));
      doc.put("dtype", "uint8");
      PrepPipeline pipeline = PrepPipeline.parse(doc);
      int height = c.get("height").asInt();
      int width = c.get("width").asInt();
      SplittableRandom rng = ImagePrep.rng(c.get("seed").asLong(), c.get("epoch").asLong(), c.get("id").asLong());
      double top = 0;
      double left = 0;
      double h = height;
      double w = width;
      long curH = height;
      long curW = width;
      boolean flip = false;
      for (PrepPipeline.Op op : pipeline.ops()) {
        if (op instanceof RandomResizedCrop rrc) {
          int[] r = SpatialOps.cropParams(height, width, rrc, rng);
          top = r[0];
          left = r[1];
          h = r[2];
          w = r[3];
          curH = rrc.height();
          curW = rrc.width();
        } else if (op instanceof Resize r) {
          long[] hw = SpatialOps.resizedSize(r, curH, curW);
          curH = hw[0];
          curW = hw[1];
        } else if (op instanceof CenterCrop cc) {
          double sy = h / curH;
          double sx = w / curW;
          top += Math.rint((curH - cc.height()) / 2.0) * sy;
          left += Math.rint((curW - cc.width()) / 2.0) * sx;
          h = cc.height() * sy;
          w = cc.width() * sx;
          curH = cc.height();
          curW = cc.width();
        } else if (op instanceof HFlip f) {
          flip = rng.nextDouble() < f.p();
        }
      }
      JsonNode box = c.get("box");
      String what = c.toString();
      assertEquals(box.get("top").asDouble(), top, 1e-9, what);
      assertEquals(box.get("left").asDouble(), left, 1e-9, what);
      assertEquals(box.get("h").asDouble(), h, 1e-9, what);
      assertEquals(box.get("w").asDouble(), w, 1e-9, what);
      assertEquals(box.get("out_h").asLong(), curH, what);
      assertEquals(box.get("out_w").asLong(), curW, what);
      assertEquals(box.get("flip").asBoolean(), flip, what);
      checked++;
    }
    assertTrue(checked >= 300, "cases: " + checked);
  }
}
