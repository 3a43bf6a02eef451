package io.unstall.flight;

import io.unstall.flight.dataset.Dataset;
import io.unstall.flight.dataset.DatasetRegistry;
import io.unstall.flight.prep.PrepService;
import io.unstall.flight.protocol.PeerTicket;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.PutResult;
import org.apache.arrow.flight.Result;
import org.apache.arrow.flight.CallStatus;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.NoOpFlightProducer;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The peer port's producer (the partitioned cache): answers PEER tickets of other sidecars of the cluster, as the
 * owner of the samples asked for, and nothing else. Its server authenticates the cluster token, never a user's,
 * so a user token opens no peer call and the cluster token opens no client call.
 */
final class PeerProducer extends NoOpFlightProducer {
  private static final Logger LOG = LoggerFactory.getLogger(PeerProducer.class);

  private final DatasetRegistry registry;
  private final BatchAssembler assembler;
  private final BufferAllocator streams;
  private final StreamBudget budget;

  private final long waitTimeoutNanos; // --wait-timeout: a peer that takes nothing frees the thread
  private final PrepService prep; // remote prep workers: peer.prep.* actions and uploads

  PeerProducer(DatasetRegistry registry, BatchAssembler assembler, BufferAllocator streams, StreamBudget budget,
      java.time.Duration waitTimeout, PrepService prep) {
    this.waitTimeoutNanos = waitTimeout.toNanos();
    this.prep = prep;
    this.registry = registry;
    this.assembler = assembler;
    this.streams = streams;
    this.budget = budget;
  }

  /** {@code peer.prep.*}: another sidecar enlisting in, claiming from or leaving one of this sidecar's groups. */
  @Override
  public void doAction(CallContext context, Action action, StreamListener<Result> listener) {
    try {
      if (!PrepService.handlesPeer(action.getType())) {
        throw CallStatus.UNIMPLEMENTED.withDescription("unknown peer action '" + action.getType()
            + "'; the peer port answers PEER tickets and peer.prep.* actions").toRuntimeException();
      }
      listener.onNext(new Result(prep.peerAction(action)));
      listener.onCompleted();
    } catch (Throwable e) {
      listener.onError(UnstallProducer.toStatus(e));
    }
  }

  /** A batch a remote prep worker prepared for one of this sidecar's groups. */
  @Override
  public Runnable acceptPut(CallContext context, FlightStream flightStream, StreamListener<PutResult> ackStream) {
    return () -> {
      try {
        if (!PrepService.handlesPeerPut(flightStream.getDescriptor())) {
          throw CallStatus.UNIMPLEMENTED.withDescription("DoPut on the peer port is only for peer.prep.put uploads")
              .toRuntimeException();
        }
        prep.acceptPeerPut(flightStream);
        ackStream.onCompleted();
      } catch (Throwable e) {
        ackStream.onError(UnstallProducer.toStatus(e));
      }
    };
  }

  @Override
  public void getStream(CallContext context, Ticket ticket, ServerStreamListener listener) {
    VectorSchemaRoot root = null;
    try {
      PeerTicket t = PeerTicket.parse(ticket.getBytes());
      Dataset d = registry.get(t.dataset());
      BatchAssembler.CheckedIds batch = BatchAssembler.checkedIds(d, t.ids());
      try (StreamBudget.Reservation r = budget.acquire(batch, () -> false)) {
        root = assembler.assembleForPeer(d, t.epoch(), batch.ids(), streams);
      }
      listener.start(root);
      UnstallProducer.awaitReady(listener, waitTimeoutNanos);
      if (!listener.isCancelled()) {
        listener.putNext();
        listener.completed();
      }
    } catch (Throwable e) {
      FlightRuntimeException status = UnstallProducer.toStatus(e);
      if (status.status().code() == CallStatus.INTERNAL.code()) {
        LOG.warn("peer fetch failed: {}", status.getMessage());
      } else {
        LOG.info("peer fetch rejected: {}", status.getMessage());
      }
      listener.error(status);
    } finally {
      if (root != null) {
        root.close();
      }
    }
  }
}
