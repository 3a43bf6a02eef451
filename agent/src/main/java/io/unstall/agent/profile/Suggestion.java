package io.unstall.agent.profile;

import java.util.Map;

/** One rule that fired: an id, advice for people, and the numbers that triggered it. */
public final class Suggestion {
  public final String rule;
  public final String message;
  public final Map<String, Object> evidence;

  public Suggestion(String rule, String message, Map<String, Object> evidence) {
    this.rule = rule;
    this.message = message;
    this.evidence = evidence;
  }

  @Override
  public String toString() {
    return rule + ": " + message + " " + evidence;
  }
}
