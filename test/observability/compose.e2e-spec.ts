import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { ROOT } from './shipped-files';

interface ComposeService {
  image: string;
  profiles?: string[];
  command?: string[];
  ports?: string[];
  volumes?: string[];
}

const compose = parse(readFileSync(join(ROOT, 'docker-compose.yml'), 'utf8')) as {
  services: Record<string, ComposeService>;
  volumes: Record<string, unknown>;
};

const STACK = ['prometheus', 'grafana', 'jaeger'];

/** No Docker here: the file is checked as data, its mounts against the repository. */
describe("docker-compose.yml's observability profile", () => {
  it('adds Prometheus, Grafana and Jaeger under the profile only; the servers stay in the default set', () => {
    for (const name of STACK) {
      expect({ name, profiles: compose.services[name]?.profiles }).toEqual({
        name,
        profiles: ['observability'],
      });
    }
    for (const name of ['rabbitmq', 'redis', 'nats', 'postgres']) {
      expect({ name, profiles: compose.services[name]?.profiles }).toEqual({ name });
    }
  });

  it('pins each image to a version and publishes its ports on loopback only', () => {
    for (const name of STACK) {
      const { image, ports = [] } = compose.services[name];
      expect({ name, image }).toEqual({
        name,
        image: expect.stringMatching(/^[\w./-]+:v?\d+\.\d+\.\d+$/) as string,
      });
      for (const port of ports) expect(port).toMatch(/^127\.0\.0\.1:\d+:\d+$/);
    }
  });

  it('mounts files of this repository that exist, and named volumes it declares', () => {
    for (const name of STACK) {
      for (const volume of compose.services[name].volumes ?? []) {
        const [source] = volume.split(':');
        if (source.startsWith('./')) {
          expect({ volume, exists: existsSync(join(ROOT, source)) }).toEqual({
            volume,
            exists: true,
          });
        } else {
          expect(Object.keys(compose.volumes)).toContain(source);
        }
      }
    }
  });

  it("starts Prometheus on the mounted config, and provisions Grafana's dashboard from the mounted folder", () => {
    const prometheus = compose.services.prometheus;
    const mount = prometheus.volumes!.find((volume) =>
      volume.startsWith('./observability/prometheus:'),
    )!;
    const [source, target] = mount.split(':');
    const configFlag = prometheus.command!.find((arg) => arg.startsWith('--config.file='))!;
    const config = configFlag.slice('--config.file='.length);
    expect(config.startsWith(`${target}/`)).toBe(true);
    expect(existsSync(join(ROOT, source, config.slice(target.length + 1)))).toBe(true);

    const provider = parse(
      readFileSync(
        join(ROOT, 'observability/grafana/provisioning/dashboards/nest-sequence.yml'),
        'utf8',
      ),
    ) as { providers: { options: { path: string } }[] };
    const dashboards = compose.services.grafana.volumes!.find((volume) =>
      volume.startsWith('./observability/grafana/dashboards:'),
    )!;
    expect(dashboards.split(':')[1]).toBe(provider.providers[0].options.path);
  });
});
