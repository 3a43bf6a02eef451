package io.unstall.flight.storage;

import java.net.URI;
import java.util.Optional;
import software.amazon.awssdk.auth.credentials.AwsCredentialsProvider;
import software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider;
import software.amazon.awssdk.core.exception.SdkClientException;
import software.amazon.awssdk.profiles.Profile;
import software.amazon.awssdk.profiles.ProfileFile;
import software.amazon.awssdk.profiles.ProfileFileSystemSetting;
import software.amazon.awssdk.profiles.ProfileProperty;
import software.amazon.awssdk.regions.Region;
import software.amazon.awssdk.regions.providers.AwsProfileRegionProvider;
import software.amazon.awssdk.regions.providers.AwsRegionProviderChain;
import software.amazon.awssdk.regions.providers.DefaultAwsRegionProviderChain;
import software.amazon.awssdk.regions.providers.SystemSettingsRegionProvider;

/**
 * How to reach S3. {@code endpoint} null means AWS itself; {@code credentials} null means the default
 * provider chain.
 */
public record S3Config(URI endpoint, Region region, AwsCredentialsProvider credentials, boolean forcePathStyle) {
  private static volatile AwsCredentialsProvider defaultCredentials;

  /**
   * As AWS tools do: endpoint from {@code aws.endpointUrlS3} / {@code AWS_ENDPOINT_URL_S3}, else {@code
   * aws.endpointUrl} / {@code AWS_ENDPOINT_URL}, else the profile's {@code endpoint_url} (unless {@code
   * AWS_IGNORE_CONFIGURED_ENDPOINT_URLS}); region
   * from the default chain ({@code AWS_REGION}, profile, instance metadata), else us-east-1; credentials
   * from the default chain ({@code AWS_ACCESS_KEY_ID}/{@code AWS_SECRET_ACCESS_KEY}, {@code AWS_PROFILE},
   * web identity, container, instance profile); path-style addressing with an endpoint override or {@code
   * AWS_S3_FORCE_PATH_STYLE=true}.
   */
  public static S3Config fromEnvironment() {
    URI endpoint = null;
    if (!setting("aws.ignoreConfiguredEndpointUrls", "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
        .equalsIgnoreCase("true")) {
      String url = setting("aws.endpointUrlS3", "AWS_ENDPOINT_URL_S3");
      if (url.isEmpty()) {
        url = setting("aws.endpointUrl", "AWS_ENDPOINT_URL");
      }
      if (url.isEmpty()) {
        url = profileEndpoint();
      }
      if (!url.isEmpty()) {
        try {
          endpoint = URI.create(url);
        } catch (IllegalArgumentException e) {
          throw new IllegalArgumentException(
              "bad S3 endpoint URL '" + url + "' (AWS_ENDPOINT_URL[_S3]): " + e.getMessage());
        }
      }
    }
    boolean pathStyle = endpoint != null
        || setting("aws.s3ForcePathStyle", "AWS_S3_FORCE_PATH_STYLE").equalsIgnoreCase("true");
    return new S3Config(endpoint, defaultRegion(endpoint != null), defaultCredentials(), pathStyle);
  }

  /** {@code endpoint_url} of the active profile: its {@code services} section's {@code s3}, else its own. */
  private static String profileEndpoint() {
    try {
      ProfileFile file = ProfileFile.defaultProfileFile();
      Optional<Profile> profile =
          file.profile(ProfileFileSystemSetting.AWS_PROFILE.getStringValue().orElse("default"));
      if (profile.isEmpty()) {
        return "";
      }
      Optional<String> services = profile.get().property("services");
      Optional<String> s3 =
          services.flatMap(name -> file.getSection("services", name)).flatMap(sec -> sec.property("s3.endpoint_url"));
      return s3.or(() -> profile.get().property(ProfileProperty.ENDPOINT_URL)).orElse("").trim();
    } catch (RuntimeException e) {
      return ""; // an unreadable config file: the SDK reports it when it needs the file
    }
  }

  private static String setting(String property, String env) {
    String v = System.getProperty(property);
    if (v == null || v.isBlank()) {
      v = System.getenv(env);
    }
    return v == null ? "" : v.trim();
  }

  /** Off AWS (an endpoint override) the region only signs requests: skip the instance-metadata probe. */
  private static Region defaultRegion(boolean customEndpoint) {
    try {
      return customEndpoint
          ? new AwsRegionProviderChain(new SystemSettingsRegionProvider(), new AwsProfileRegionProvider()).getRegion()
          : new DefaultAwsRegionProviderChain().getRegion();
    } catch (SdkClientException e) {
      return Region.US_EAST_1;
    }
  }

  /** One default chain per process, so that storages share its cache and their client. */
  private static AwsCredentialsProvider defaultCredentials() {
    if (defaultCredentials == null) {
      synchronized (S3Config.class) {
        if (defaultCredentials == null) {
          defaultCredentials = DefaultCredentialsProvider.builder().build();
        }
      }
    }
    return defaultCredentials;
  }

  /** Where requests go, for messages. */
  String endpointName() {
    return endpoint != null ? endpoint.toString() : "https://s3." + region.id() + ".amazonaws.com";
  }
}
