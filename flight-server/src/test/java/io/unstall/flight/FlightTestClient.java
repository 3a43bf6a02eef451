package io.unstall.flight;

import static org.junit.jupiter.api.Assertions.assertEquals;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.unstall.flight.protocol.FetchTicket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Result;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.vector.BigIntVector;
import org.apache.arrow.vector.VarBinaryVector;

/** A real Flight client of a test data plane, with the token, and the calls tests make. */
final class FlightTestClient implements AutoCloseable {
  static final String TOKEN = "0123456789abcdef0123456789abcdef";
  static final ObjectMapper JSON = new ObjectMapper();

  final FlightClient client;
  final HeaderCallOption auth;

  FlightTestClient(BufferAllocator allocator, DataPlane plane) {
    client = FlightClient.builder(allocator, plane.location()).build();
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + TOKEN);
    auth = new HeaderCallOption(h);
  }

  /** Fetches ids as one batch; checks the ids echo and returns the payloads. */
  List<byte[]> fetch(String dataset, long epoch, long... ids) throws Exception {
    try (FlightStream s = client.getStream(new FetchTicket(dataset, epoch, ids).toTicket(), auth)) {
      return drain(s, ids);
    }
  }

  /** Reads a fetch's whole stream, checking that it echoes {@code ids} in order; returns the payloads. */
  static List<byte[]> drain(FlightStream s, long[] ids) throws Exception {
    List<byte[]> out = new ArrayList<>();
    while (s.next()) {
      BigIntVector id = (BigIntVector) s.getRoot().getVector("id");
      VarBinaryVector payload = (VarBinaryVector) s.getRoot().getVector("payload");
      for (int i = 0; i < s.getRoot().getRowCount(); i++) {
        assertEquals(ids[out.size()], id.get(i));
        out.add(payload.get(i));
      }
    }
    return out;
  }

  JsonNode action(String type, byte[] body) throws Exception {
    Iterator<Result> r = client.doAction(new Action(type, body), auth);
    return JSON.readTree(new String(r.next().getBody(), StandardCharsets.UTF_8));
  }

  JsonNode stats() throws Exception {
    return action("stats", new byte[0]);
  }

  static long[] range(int n) {
    long[] ids = new long[n];
    for (int i = 0; i < n; i++) {
      ids[i] = i;
    }
    return ids;
  }

  @Override
  public void close() throws Exception {
    client.close();
  }
}
