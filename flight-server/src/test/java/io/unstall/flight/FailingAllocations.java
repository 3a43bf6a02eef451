package io.unstall.flight;

import java.util.concurrent.atomic.AtomicInteger;
import org.apache.arrow.memory.AllocationManager;
import org.apache.arrow.memory.ArrowBuf;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.apache.arrow.memory.netty.NettyAllocationManager;

/**
 * Real Arrow memory whose allocations for one child allocator (by name: "prefetch", "cache") fail the way
 * exhausted direct memory does ({@link OutOfMemoryError}, not Arrow's limit exception): a root allocator to
 * build a data plane on. Child allocators inherit the root's allocation manager factory.
 */
final class FailingAllocations implements AllocationManager.Factory {
  private final String allocator;
  final AtomicInteger failures = new AtomicInteger();

  /** Allocations for the child allocator named {@code allocator} fail. */
  FailingAllocations(String allocator) {
    this.allocator = allocator;
  }

  /** A root allocator of {@code limit} bytes using this factory. */
  RootAllocator root(long limit) {
    return new RootAllocator(
        RootAllocator.configBuilder().maxAllocation(limit).allocationManagerFactory(this).build());
  }

  @Override
  public AllocationManager create(BufferAllocator accountingAllocator, long size) {
    if (accountingAllocator.getName().equals(allocator)) {
      failures.incrementAndGet();
      throw new OutOfMemoryError("Cannot reserve " + size + " bytes of direct buffer memory (injected for '"
          + allocator + "')");
    }
    return NettyAllocationManager.FACTORY.create(accountingAllocator, size);
  }

  @Override
  public ArrowBuf empty() {
    return NettyAllocationManager.FACTORY.empty();
  }
}
