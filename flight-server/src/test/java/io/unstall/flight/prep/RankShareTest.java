package io.unstall.flight.prep;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.protocol.ProtocolFixturesTest;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Random;
import org.apache.arrow.flight.FlightRuntimeException;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * Data-parallel ranks in a prep group: each rank member reads its share of each epoch (the shim's
 * {@code unstall.elastic.Share} with one batch per step), its cursor is its next batch, so the slowest cursor frees
 * a batch once every rank that reads it did, and a rank finishes after its own last batch.
 */
class RankShareTest {
  @TempDir
  Path dir;
  DatasetRegistry registry;
  GroupLock lock = new GroupLock();
  Membership members;

  /** Twenty samples in batches of two: ten batches an epoch. */
  @BeforeEach
  void start() throws Exception {
    Path c0 = Files.createDirectories(dir.resolve("imgs").resolve("c0"));
    for (int i = 0; i < 20; i++) {
      Files.write(c0.resolve("s" + i + ".jpg"), new byte[] {(byte) i});
    }
    registry = new DatasetRegistry();
    Dataset d = registry.register("imgs", "imagefolder", dir.resolve("imgs").toString());
    BatchOrder order = new BatchOrder("g", new PrepGroup.Key("imgs", "fake", 7, 2, false, false), d);
    members = new Membership(order, StagingTest.settings(3, 0, false), lock, "");
  }

  @AfterEach
  void stop() throws Exception {
    registry.close();
  }

  /** The positions of {@code [from, to)} rank {@code rank} reads, by the shim's rule written out. */
  static List<Long> expected(int world, int rank, int nb, long epoch, long[][] consumed, long skip, long from,
      long to) {
    List<Long> out = new ArrayList<>();
    for (long e = from / nb; e * nb < to; e++) {
      List<Long> remaining = new ArrayList<>();
      for (long b = 0; b < nb; b++) {
        boolean done = false;
        for (long[] r : e == epoch ? consumed : new long[0][]) {
          done |= r[0] <= b && b < r[1];
        }
        if (!done) {
          remaining.add(e * nb + b);
        }
      }
      for (int i = 0; i < remaining.size(); i++) {
        long p = remaining.get(i);
        if (i % world == rank && (e != epoch || i >= skip * world) && p >= from && p < to) {
          out.add(p);
        }
      }
    }
    return out;
  }

  static List<Long> walked(RankShare s, long from, long to) {
    List<Long> out = new ArrayList<>();
    for (long p = s.next(from); p < to; p = s.next(p + 1)) {
      out.add(p);
    }
    return out;
  }

  @Test
  void nextWalksTheSharesOfTheRestoredAndTheWholeEpochs() {
    Random rng = new Random(3);
    for (int trial = 0; trial < 500; trial++) {
      int nb = 1 + rng.nextInt(12);
      int world = 1 + rng.nextInt(5);
      List<long[]> ranges = new ArrayList<>();
      for (long at = rng.nextInt(3); at < nb; at += 1 + rng.nextInt(4)) {
        long end = Math.min(nb, at + 1 + rng.nextInt(3));
        ranges.add(new long[] {at, end});
        at = end;
      }
      long[][] consumed = ranges.toArray(new long[0][]);
      long skip = rng.nextInt(3);
      List<Long> all = new ArrayList<>();
      for (int rank = 0; rank < world; rank++) {
        RankShare s = new RankShare(world, rank, nb, 1, consumed, skip);
        long from = rng.nextInt(4 * nb);
        assertEquals(expected(world, rank, nb, 1, consumed, skip, from, 4L * nb), walked(s, from, 4L * nb),
            "nb " + nb + " world " + world + " rank " + rank + " from " + from + " skip " + skip);
        if (skip == 0) {
          all.addAll(walked(s, 0, 4L * nb));
        }
      }
      if (skip == 0) {
        assertEquals(4L * nb - ranges.stream().mapToLong(r -> r[1] - r[0]).sum(), all.size(),
            "the ranks read every batch not consumed once");
        assertEquals(all.size(), all.stream().distinct().count());
      }
    }
  }

  /**
   * protocol/fixtures/share-v1.json, which the shim's {@code elastic.Share} also gives: its cases of one batch per
   * step without drop_last (a prep group's) walked from the epoch's start, and for a whole epoch (nothing consumed,
   * nothing skipped) also as a rank that was not restored.
   */
  @Test
  void nextWalksTheGoldenFixturesBatches() throws Exception {
    JsonNode cases = new ObjectMapper().readTree(ProtocolFixturesTest.FIXTURES.resolve("share-v1.json").toFile())
        .get("cases");
    int checked = 0;
    for (JsonNode c : cases) {
      if (c.get("chunk").asInt() != 1 || c.get("drop_last").asBoolean()) {
        continue;
      }
      long nb = c.get("epoch_size").asLong();
      long[][] consumed = new long[c.get("consumed").size()][];
      for (int i = 0; i < consumed.length; i++) {
        consumed[i] = new long[] {c.get("consumed").get(i).get(0).asLong(), c.get("consumed").get(i).get(1).asLong()};
      }
      List<Long> expected = new ArrayList<>();
      c.get("batches").forEach(batch -> batch.forEach(p -> expected.add(p.asLong())));
      int world = c.get("world_size").asInt();
      int rank = c.get("rank").asInt();
      long skip = c.get("skip").asLong();
      assertEquals(expected, walked(new RankShare(world, rank, nb, 0, consumed, skip), 0, nb), c.toString());
      if (consumed.length == 0 && skip == 0) {
        assertEquals(expected, walked(new RankShare(world, rank, nb, -1, consumed, 0), 0, nb), c.toString());
      }
      checked++;
    }
    assertTrue(checked >= 100, "cases of one batch per step without drop_last: " + checked);
  }

  @Test
  void cursorsAreEachRanksNextBatchAndARankFinishesAfterItsLast() {
    synchronized (lock) {
      List<Membership.Member> ranks = new ArrayList<>();
      for (int r = 0; r < 4; r++) { // one epoch of ten batches: ranks 0 and 1 read three, 2 and 3 read two
        ranks.add(members.join(r, "rank " + r, 1, -1, -1, new RankShare(4, r, 10, -1, new long[0][], 0)));
      }
      members.maybeStart(0);
      assertEquals(List.of(0L, 1L, 2L, 3L), ranks.stream().map(m -> m.cursor).toList());
      Membership.Member r1 = ranks.get(1);
      FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> members.position(r1, 0, 2));
      assertTrue(e.getMessage().contains("rank 1 of 4 and does not read epoch 0 batch 2"), e.getMessage());
      assertEquals(5, members.position(r1, 0, 5), "a later batch of its own: the cursor moves on the request");
      Membership.Member r3 = ranks.get(3);
      r3.cursor = r3.next(7 + 1);
      assertEquals(10, r3.cursor, "past rank 3's last batch (7): the end of its one epoch");
      assertEquals(0, members.minCursor(), "rank 0 has not read batch 0: nothing is freed");
      ranks.get(0).cursor = ranks.get(0).next(1);
      assertEquals(1, members.minCursor(), "batch 0 read by the one rank that reads it: freed");
    }
  }

  @Test
  void aRestoredRankJoinsAtItsNextBatchAndOneWithNothingLeftIsGoneAtOnce() {
    synchronized (lock) {
      long[][] consumed = {{0, 7}};
      Membership.Member r0 = members.join(1, "rank 0", 1, 0, 0, new RankShare(3, 0, 10, 0, consumed, 0));
      Membership.Member r1 = members.join(2, "rank 1", 1, 0, 0, new RankShare(3, 1, 10, 0, consumed, 0));
      assertEquals(7, r0.cursor);
      assertEquals(8, r1.cursor);
      Membership.Member r2 = members.join(3, "rank 2", 1, 0, 0, new RankShare(3, 2, 10, 0, consumed, 1));
      assertNotNull(r2);
      assertEquals(10, r2.cursor, "it read its share's one batch (9) before the checkpoint");
      assertFalse(members.isMember(3));
      FlightRuntimeException e = assertThrows(FlightRuntimeException.class, () -> members.member(3));
      assertTrue(e.getMessage().contains("finished: its share of its 1 epochs had nothing left"), e.getMessage());
      members.maybeStart(0);
      e = assertThrows(FlightRuntimeException.class, () -> members.join(4, "late rank 2", 1, 0, 0,
          new RankShare(3, 2, 10, 0, new long[0][], 0)));
      assertTrue(e.getMessage().contains("cannot start a member at epoch 0"), e.getMessage());
    }
  }
}
