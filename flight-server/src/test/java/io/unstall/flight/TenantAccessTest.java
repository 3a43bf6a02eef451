package io.unstall.flight;

import static io.unstall.flight.FlightTestClient.TOKEN;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import io.unstall.flight.auth.TenantTokens;
import io.unstall.flight.protocol.FetchTicket;
import io.unstall.flight.protocol.Plan;
import io.unstall.flight.protocol.PrepTicket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import org.apache.arrow.flight.Action;
import org.apache.arrow.flight.CallHeaders;
import org.apache.arrow.flight.Criteria;
import org.apache.arrow.flight.FlightCallHeaders;
import org.apache.arrow.flight.FlightClient;
import org.apache.arrow.flight.FlightDescriptor;
import org.apache.arrow.flight.FlightInfo;
import org.apache.arrow.flight.FlightRuntimeException;
import org.apache.arrow.flight.FlightStatusCode;
import org.apache.arrow.flight.FlightStream;
import org.apache.arrow.flight.HeaderCallOption;
import org.apache.arrow.flight.Result;
import org.apache.arrow.flight.Ticket;
import org.apache.arrow.memory.BufferAllocator;
import org.apache.arrow.memory.RootAllocator;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.function.Executable;
import org.junit.jupiter.api.io.TempDir;

/**
 * A tenant token over real Flight: it reads the datasets granted to it, and every call that names another
 * dataset (DoGet, GetFlightInfo, the prefetch and prep actions, PREP tickets) is PERMISSION_DENIED naming only
 * that dataset; listings and stats show only what it was granted. The owner's token still sees everything.
 */
class TenantAccessTest {
  @TempDir Path dir;
  BufferAllocator root;
  DataPlane plane;
  TenantTokens tenants;
  FlightTestClient owner;
  FlightClient client;
  HeaderCallOption tenant;
  String tenantId;

  @BeforeEach
  void start() throws Exception {
    io.unstall.flight.format.ImageFolders.write(dir.resolve("mine"), 2, 3, i -> 100, 1);
    io.unstall.flight.format.ImageFolders.write(dir.resolve("secret"), 2, 3, i -> 100, 2);
    root = new RootAllocator(64L << 20);
    java.nio.file.Files.createDirectories(dir.resolve("home"));
    tenants = TenantTokens.open(dir.resolve("home").resolve(TenantTokens.FILE_NAME));
    plane = DataPlane.builder(root, TOKEN).port(0).cacheCapacity(1 << 20).tenants(tenants).build().start();
    plane.registry().register("granted-ds", "imagefolder", dir.resolve("mine").toString());
    plane.registry().register("secret-ds", "imagefolder", dir.resolve("secret").toString());
    TenantTokens.Issued issued = tenants.issue(List.of("granted-ds", "granted-later"), "bob");
    tenantId = issued.tenant().id();
    owner = new FlightTestClient(root, plane);
    client = owner.client;
    CallHeaders h = new FlightCallHeaders();
    h.insert("authorization", "Bearer " + issued.token());
    tenant = new HeaderCallOption(h);
  }

  @AfterEach
  void stop() throws Exception {
    owner.close();
    plane.close();
    root.close();
  }

  private long rows(Ticket t, HeaderCallOption auth) throws Exception {
    long n = 0;
    try (FlightStream s = client.getStream(t, auth)) {
      while (s.next()) {
        n += s.getRoot().getRowCount();
      }
    }
    return n;
  }

  private static FlightRuntimeException fails(FlightStatusCode code, Executable call) {
    FlightRuntimeException e = assertThrows(FlightRuntimeException.class, call);
    assertEquals(code, e.status().code(), e::toString);
    return e;
  }

  /** Refused, naming {@code asked} and the token's id, and never the other dataset. */
  private void denied(String asked, Executable call) {
    String msg = fails(FlightStatusCode.UNAUTHORIZED, call).getMessage();
    assertTrue(msg.contains("'" + asked + "'") && msg.contains(tenantId), msg);
    assertFalse(msg.contains("granted-ds") && !asked.equals("granted-ds"), "names no other dataset: " + msg);
  }

  private JsonNode action(HeaderCallOption auth, String type, byte[] body) throws Exception {
    Iterator<Result> r = client.doAction(new Action(type, body), auth);
    return FlightTestClient.JSON.readTree(new String(r.next().getBody(), StandardCharsets.UTF_8));
  }

  @Test
  void aTenantReadsItsGrantedDatasetsOnly() throws Exception {
    assertEquals(2, rows(new FetchTicket("granted-ds", 0, new long[] {0, 5}).toTicket(), tenant));
    denied("secret-ds", () -> rows(new FetchTicket("secret-ds", 0, new long[] {0}).toTicket(), tenant));
    denied("secret-ds", () -> client.getInfo(FlightDescriptor.path("secret-ds"), tenant));
    denied("no-such-ds", () -> rows(new FetchTicket("no-such-ds", 0, new long[] {0}).toTicket(), tenant));
    // granted but not registered: NOT_FOUND, listing only what the tenant may see
    String notFound = fails(FlightStatusCode.NOT_FOUND,
        () -> rows(new FetchTicket("granted-later", 0, new long[] {0}).toTicket(), tenant)).getMessage();
    assertTrue(notFound.contains("granted-later") && notFound.contains("granted-ds"), notFound);
    assertFalse(notFound.contains("secret-ds"), notFound);
    denied("secret-ds", () -> action(tenant, "prefetch", new Plan("secret-ds", 0, new long[] {0}).toBytes()));

    List<String> listed = new ArrayList<>();
    for (FlightInfo i : client.listFlights(Criteria.ALL, tenant)) {
      listed.add(i.getDescriptor().getPath().get(0));
    }
    assertEquals(List.of("granted-ds"), listed);
    JsonNode stats = action(tenant, "stats", new byte[0]);
    assertTrue(stats.get("datasets").has("granted-ds") && !stats.get("datasets").has("secret-ds"), stats.toString());
    JsonNode all = owner.stats();
    assertTrue(all.get("datasets").has("granted-ds") && all.get("datasets").has("secret-ds"), "the owner sees all");
    assertEquals(6, rows(new FetchTicket("secret-ds", 0, FlightTestClient.range(6)).toTicket(), owner.auth));
  }

  @Test
  void prepGroupsOfOtherDatasetsAreRefusedAndTenantsNeverGetSharedMemory() throws Exception {
    denied("secret-ds", () -> action(tenant, "prep.join",
        "{\"dataset\":\"secret-ds\",\"pipeline\":null,\"batch_size\":2}".getBytes(StandardCharsets.UTF_8)));
    JsonNode theirs = action(owner.auth, "prep.join",
        "{\"dataset\":\"secret-ds\",\"pipeline\":null,\"batch_size\":2}".getBytes(StandardCharsets.UTF_8));
    String group = theirs.get("group").asText();
    String msg = fails(FlightStatusCode.UNAUTHORIZED, () -> action(tenant, "prep.heartbeat",
        ("{\"group\":\"" + group + "\",\"member\":" + theirs.get("member") + "}").getBytes(StandardCharsets.UTF_8)))
        .getMessage();
    assertTrue(msg.contains(group) && !msg.contains("secret-ds"), msg);
    fails(FlightStatusCode.UNAUTHORIZED,
        () -> rows(new PrepTicket(group, theirs.get("member").asLong(), 0, 0).toTicket(), tenant));

    JsonNode mine = action(tenant, "prep.join",
        "{\"dataset\":\"granted-ds\",\"pipeline\":null,\"batch_size\":2,\"shm\":true}"
            .getBytes(StandardCharsets.UTF_8));
    assertFalse(mine.get("shm").asBoolean(), "a tenant reads PREP tickets, never the owner's /dev/shm files");
    assertEquals(2,
        rows(new PrepTicket(mine.get("group").asText(), mine.get("member").asLong(), 0, 0).toTicket(), tenant));
    fails(FlightStatusCode.UNAUTHORIZED, () -> action(tenant, "prep.next", ("{\"group\":\"" + mine.get("group").asText()
        + "\",\"member\":" + mine.get("member") + ",\"epoch\":0,\"batch\":1}").getBytes(StandardCharsets.UTF_8)));
    JsonNode groups = action(tenant, "prep.stats", new byte[0]).get("groups");
    assertTrue(groups.has(mine.get("group").asText()) && !groups.has(group), groups.toString());
    assertTrue(action(owner.auth, "prep.stats", new byte[0]).get("groups").has(group));
  }

  @Test
  void aRevokedTokenIsRefusedAtItsNextCall() throws Exception {
    assertEquals(1, rows(new FetchTicket("granted-ds", 0, new long[] {1}).toTicket(), tenant));
    tenants.revoke(tenantId);
    FlightRuntimeException e = fails(FlightStatusCode.UNAUTHENTICATED,
        () -> rows(new FetchTicket("granted-ds", 0, new long[] {1}).toTicket(), tenant));
    assertTrue(e.getMessage().contains("not revoked"), e.getMessage());
    assertEquals(1, rows(new FetchTicket("granted-ds", 0, new long[] {1}).toTicket(), owner.auth));
  }
}
