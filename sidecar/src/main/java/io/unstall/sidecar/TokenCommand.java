package io.unstall.sidecar;

import io.unstall.flight.auth.TenantTokens;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.Callable;
import picocli.CommandLine.Command;
import picocli.CommandLine.Option;
import picocli.CommandLine.Parameters;
import picocli.CommandLine.Mixin;

/**
 * {@code token}: the owner issues, lists and revokes tenant tokens in the sidecar home's {@code tenants.json}.
 * A running sidecar sees the change at its next call; none needs to run. Only the issued token's SHA-256 is
 * stored: {@code issue} prints the token once, on stdout.
 */
@Command(
    name = "token",
    mixinStandardHelpOptions = true,
    description = "Issue, list or revoke tenant tokens (Flight only, granted datasets only).",
    subcommands = {TokenCommand.Issue.class, TokenCommand.Revoke.class, TokenCommand.ListTokens.class})
public final class TokenCommand implements Runnable {
  @Override
  public void run() {
    throw new IllegalArgumentException("name a subcommand: issue, list or revoke");
  }

  /** {@code --home}, on each subcommand. */
  static final class Home {
    @Option(names = "--home", defaultValue = "${env:UNSTALL_HOME:-${sys:user.home}/.unstall}",
        description = "The sidecar home whose tenants.json to use (default ${DEFAULT-VALUE}).")
    Path home;

    TenantTokens tenants() throws Exception {
      Path h = Secrets.privateDirectory(home.toAbsolutePath());
      return TenantTokens.open(h.resolve(TenantTokens.FILE_NAME));
    }
  }

  @Command(name = "issue", mixinStandardHelpOptions = true,
      description = "Issue a token for the named datasets; prints the token (shown only this once).")
  static final class Issue implements Callable<Integer> {
    @Mixin Home parent;

    @Option(names = "--dataset", required = true, paramLabel = "NAME", description = "A dataset to grant; repeatable.")
    List<String> datasets = new ArrayList<>();

    @Option(names = "--name", defaultValue = "", description = "Who the token is for, shown by list.")
    String name;

    @Override
    public Integer call() throws Exception {
      TenantTokens.Issued issued = parent.tenants().issue(datasets, name);
      System.out.println(issued.token());
      System.err.println("issued tenant token " + issued.tenant().id() + " for datasets "
          + String.join(", ", issued.tenant().datasets()) + " (it is not stored and cannot be shown again)");
      return 0;
    }
  }

  @Command(name = "revoke", mixinStandardHelpOptions = true, description = "Revoke a token by its id.")
  static final class Revoke implements Callable<Integer> {
    @Mixin Home parent;

    @Parameters(paramLabel = "ID", description = "The token's id (see list).")
    String id;

    @Override
    public Integer call() throws Exception {
      parent.tenants().revoke(id);
      System.err.println("revoked tenant token " + id);
      return 0;
    }
  }

  @Command(name = "list", mixinStandardHelpOptions = true, description = "The tokens issued and not revoked.")
  static final class ListTokens implements Callable<Integer> {
    @Mixin Home parent;

    @Override
    public Integer call() throws Exception {
      for (TenantTokens.Tenant t : parent.tenants().list()) {
        System.out.println(ControlPlane.describe(t));
      }
      return 0;
    }
  }
}
