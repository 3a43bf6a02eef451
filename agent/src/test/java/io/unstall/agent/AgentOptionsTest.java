package io.unstall.agent;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import io.unstall.agent.instrument.IteratorInstrumentation;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

class AgentOptionsTest {
  @Test
  void defaults() {
    AgentOptions o = AgentOptions.parse(null);
    assertTrue(o.io());
    assertTrue(o.tracing());
    assertEquals(AgentOptions.BUILTIN_METHODS, o.allMethods());
    assertEquals("unstall-profile-" + ProcessHandle.current().pid(), o.profile());
    assertNull(o.spansFile());
  }

  @Test
  void repeatedKeysAccumulateAndOtelKeysPassThrough() {
    AgentOptions o =
        AgentOptions.parse(
            "method=com.acme.Loader#nextBatch, method=com.acme.Other#take,builtin.methods=false,"
                + "exclude=/scratch,exclude=*.idx,profile=off,otel.service.name=trainer,debug");
    assertEquals(List.of("com.acme.Loader#nextBatch", "com.acme.Other#take"), o.allMethods());
    assertEquals(List.of("/scratch", "*.idx"), o.excludes());
    assertNull(o.profile());
    assertEquals(Map.of("otel.service.name", "trainer"), o.otelProperties());
    assertTrue(o.debug());
    assertFalse(o.failAtStall() > 0);
  }

  @Test
  void rejectsUnknownKeysAndBadMethods() {
    assertThrows(IllegalArgumentException.class, () -> AgentOptions.parse("colour=blue"));
    assertThrows(IllegalArgumentException.class, () -> AgentOptions.parse("method=NoHash"));
  }

  @Test
  void methodSpecsGroupByType() {
    assertEquals(
        Map.of("a.B", List.of("next", "take"), "c.D", List.of("next")),
        IteratorInstrumentation.parse(List.of("a.B#next", "c.D#next", "a.B#take")));
  }
}
