package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.code_intelligence.jazzer.junit.FuzzTest;
import io.unstall.flight.UnstallProducer;
import io.unstall.flight.protocol.MalformedTicketException;
import io.unstall.flight.protocol.Plan;
import java.util.Arrays;
import java.util.List;

/**
 * Fuzz target for the DoAction bodies the producer parses (docs/ARCHITECTURE.md, "Fuzzing"): the first byte picks
 * the action, the rest is its body, parsed as {@code UnstallProducer.doAction} and {@code PrepService} do before
 * they look anything up: {@code prefetch} (a PLAN message), the JSON bodies of {@code prep.join},
 * {@code prep.heartbeat}, {@code prep.leave}, {@code prep.claim} and {@code prep.next}, and the descriptor
 * command of a {@code prep.put} upload. A body is either accepted or refused with an IllegalArgumentException
 * that names the action or the field (a Flight INVALID_ARGUMENT); anything else would reach the client as
 * INTERNAL. An accepted pipeline's canonical form must parse to the same fingerprint (the group key).
 */
class ActionBodiesFuzzTest {
  static final List<String> ACTIONS = List.of(UnstallProducer.ACTION_PREFETCH, PrepService.ACTION_JOIN,
      PrepService.ACTION_HEARTBEAT, PrepService.ACTION_LEAVE, PrepService.ACTION_CLAIM, PrepService.ACTION_NEXT,
      "prep.put");

  @FuzzTest
  void actionBody(byte[] input) {
    if (input.length == 0) {
      return;
    }
    String action = ACTIONS.get(Byte.toUnsignedInt(input[0]) % ACTIONS.size());
    byte[] body = Arrays.copyOfRange(input, 1, input.length);
    try {
      switch (action) {
        case UnstallProducer.ACTION_PREFETCH -> {
          long declared = Plan.declaredSize(body); // checked against --max-plan-ids before the parse
          Plan p = Plan.parse(body);
          assertArrayEquals(body, p.toBytes());
          assertEquals(p.size(), declared);
        }
        case PrepService.ACTION_JOIN -> {
          PrepRequests.Join j = PrepRequests.join(PrepRequests.body(action, body), PrepPipeline.DecodeLimits.DEFAULT);
          assertTrue(j.batchSize() >= 1 && j.batchSize() <= 65536);
          if (j.pipeline() != null) {
            assertEquals(j.pipeline().fingerprint(),
                PrepPipeline.parse(j.pipeline().canonical(), PrepPipeline.DecodeLimits.DEFAULT).fingerprint());
          }
          assertNotNull(j.fingerprint());
        }
        case PrepService.ACTION_HEARTBEAT, PrepService.ACTION_LEAVE ->
            assertNotNull(PrepRequests.member(PrepRequests.body(action, body)).group());
        case PrepService.ACTION_CLAIM, PrepService.ACTION_NEXT ->
            checkAt(PrepRequests.at(action, PrepRequests.body(action, body)));
        default -> checkAt(PrepRequests.put(body));
      }
    } catch (MalformedTicketException e) {
      assertEquals(UnstallProducer.ACTION_PREFETCH, action, e.getMessage());
    } catch (IllegalArgumentException e) {
      String m = e.getMessage();
      assertTrue(m.startsWith(action + ": ") || m.startsWith("prep pipeline") || m.startsWith("prep op #")
          || m.startsWith("\"member\""), action + " refused without naming it: " + m);
    }
  }

  private static void checkAt(PrepRequests.At at) {
    assertTrue(at.epoch() >= 0 && at.epoch() <= 0xFFFFFFFFL && at.batch() >= 0 && at.batch() <= 0xFFFFFFFFL,
        at.toString());
  }
}
