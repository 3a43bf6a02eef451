package io.unstall.flight;

import java.time.Duration;

/**
 * How much work the data plane takes on per request and in all, so that no client (buggy, hostile or merely
 * numerous) can make it grow without limit (docs/ARCHITECTURE.md, "Bounds"). Each bound is a {@code serve}
 * option, named in the error a client gets when it reaches it.
 *
 * @param flightThreads the Flight executor's threads ({@code --flight-threads}); a quarter of them (at least 2)
 *     are kept for calls that never wait, the rest may run calls that wait
 * @param flightQueue tasks that wait for a Flight executor thread ({@code --flight-queue})
 * @param localConnections same-host socket connections, one thread each ({@code --local-connections})
 * @param waitTimeout how long a call waits inside the sidecar for a prep batch or claim, for staging room, for
 *     storage bandwidth or for its client to take the batch ({@code --wait-timeout})
 * @param maxPlanIds ids in one PLAN message ({@code --max-plan-ids}); a plan also names at most every sample once
 * @param statsEpochs epochs whose counters a dataset keeps in stats, the latest begun ({@code --stats-epochs})
 * @param prepGroups open coordinated-prep groups, two producer threads each ({@code --prep-groups})
 * @param prepThreads the prep pool's decode threads, shared by all groups ({@code --prep-threads})
 * @param prepClaimTimeout how long a member may take to upload a batch it claimed ({@code --prep-claim-timeout})
 */
public record Bounds(
    int flightThreads,
    int flightQueue,
    int localConnections,
    Duration waitTimeout,
    int maxPlanIds,
    int statsEpochs,
    int prepGroups,
    int prepThreads,
    Duration prepClaimTimeout) {

  public static final int FLIGHT_THREADS = 128;
  public static final int FLIGHT_QUEUE = 4096;
  public static final int LOCAL_CONNECTIONS = 1024;
  public static final Duration WAIT_TIMEOUT = Duration.ofSeconds(120);
  public static final int MAX_PLAN_IDS = 1 << 25;
  public static final int STATS_EPOCHS = 64;
  public static final int PREP_GROUPS = 16;
  public static final Duration PREP_CLAIM_TIMEOUT = Duration.ofSeconds(120);

  public Bounds {
    atLeast("--flight-threads", flightThreads, 4);
    atLeast("--flight-queue", flightQueue, 1);
    atLeast("--local-connections", localConnections, 1);
    atLeast("--max-plan-ids", maxPlanIds, 1);
    atLeast("--stats-epochs", statsEpochs, 1);
    atLeast("--prep-groups", prepGroups, 1);
    atLeast("--prep-threads", prepThreads, 1);
    positive("--wait-timeout", waitTimeout);
    positive("--prep-claim-timeout", prepClaimTimeout);
  }

  /** The defaults; the prep pool has a thread per core unless {@code -Dunstall.prep.threads} says otherwise. */
  public static Bounds defaults() {
    return new Bounds(FLIGHT_THREADS, FLIGHT_QUEUE, LOCAL_CONNECTIONS, WAIT_TIMEOUT, MAX_PLAN_IDS, STATS_EPOCHS,
        PREP_GROUPS, defaultPrepThreads(), PREP_CLAIM_TIMEOUT);
  }

  public static int defaultPrepThreads() {
    return Math.max(1, Integer.getInteger("unstall.prep.threads", Runtime.getRuntime().availableProcessors()));
  }

  /** Flight calls that may wait (fetches, prep reads and claims, uploads, plans) run on at most this many threads. */
  public int waitingCalls() {
    return flightThreads - Math.max(2, flightThreads / 4);
  }

  private static void atLeast(String option, int value, int min) {
    if (value < min) {
      throw new IllegalArgumentException(
          "invalid value for option '" + option + "': " + value + " (must be at least " + min + ")");
    }
  }

  private static void positive(String option, Duration d) {
    if (d == null || d.isNegative() || d.isZero()) {
      throw new IllegalArgumentException("invalid value for option '" + option + "': " + d + " (must be > 0)");
    }
  }
}
