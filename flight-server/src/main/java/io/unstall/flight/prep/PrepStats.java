package io.unstall.flight.prep;

import com.fasterxml.jackson.databind.node.JsonNodeFactory;
import com.fasterxml.jackson.databind.node.ObjectNode;
import io.unstall.flight.auth.Principal;

/**
 * The {@code prep.stats} document: the pool, staging memory, the decode budget and decoder, the restart-indexed
 * copies, each group a caller may see ({@link PrepGroup#statsJson}) and, for the owner, this sidecar's remote prep
 * workers.
 */
final class PrepStats {
  private final PrepResources shared;
  private final PrepPipeline.DecodeLimits decodeLimits;
  private final PrepGroups groups;
  private final RemotePrep remote;

  PrepStats(PrepResources shared, PrepPipeline.DecodeLimits decodeLimits, PrepGroups groups, RemotePrep remote) {
    this.shared = shared;
    this.decodeLimits = decodeLimits;
    this.groups = groups;
    this.remote = remote;
  }

  /** Prep stats with the groups of the datasets {@code caller} may read. */
  String json(Principal caller) {
    ObjectNode o = JsonNodeFactory.instance.objectNode();
    o.put("v", 1);
    o.put("threads", shared.threads());
    o.put("max_groups", groups.maxGroups());
    ObjectNode st = o.putObject("staging");
    st.put("limit_bytes", shared.allocator().getLimit());
    st.put("allocated_bytes", shared.allocator().getAllocatedMemory());
    st.put("peak_bytes", shared.allocator().getPeakMemoryAllocation());
    shared.slotPool().stats(st);
    decode(o.putObject("decode"));
    ObjectNode gs = o.putObject("groups");
    for (PrepGroup g : groups.all()) {
      if (caller.mayRead(g.key.dataset())) {
        gs.set(g.id, g.statsJson());
      }
    }
    if (caller.owner()) {
      remote.stats(o.putArray("workers")); // groups of other sidecars this one prepares batches for
    }
    return o.toString();
  }

  private void decode(ObjectNode dc) {
    DecodeBudget budget = shared.decodeBudget();
    decodeLimits.putTo(dc);
    dc.put("memory_limit_bytes", budget.limit());
    dc.put("memory_reserved_bytes", budget.reservedBytes());
    dc.put("memory_peak_bytes", budget.peakBytes());
    dc.put("largest_request_bytes", budget.largestRequest());
    dc.put("waits", budget.waits());
    dc.put("decoder", NativeJpeg.AVAILABLE ? NativeJpeg.NAME : NativeJpeg.OPENCV); // for JPEGs the fast path takes
    if (!NativeJpeg.AVAILABLE) {
      dc.put("decoder_reason", NativeJpeg.PROBLEM);
    }
    dc.put("samples_native", NativeJpeg.NATIVE_SAMPLES.sum()); // this process, every group
    dc.put("samples_opencv", NativeJpeg.OPENCV_SAMPLES.sum());
    if (NativeJpeg.AVAILABLE) {
      dc.put("samples_spliced", NativeJpeg.splicedDecodes()); // of samples_native: only the crop's MCUs decoded
    }
    shared.reindexed().stats(dc.putObject("reindexed"));
    shared.decoded().stats(dc.putObject("decoded"));
  }
}
