/** A map that forgets its oldest entries beyond `limit`: what a model's calls fill cannot grow without bound. */
export class Bounded<K, V> {
  private readonly map = new Map<K, V>();

  constructor(private readonly limit = 1024) {}

  set(key: K, value: V): void {
    this.map.delete(key);
    this.map.set(key, value);
    while (this.map.size > this.limit) this.map.delete(this.map.keys().next().value as K);
  }

  get(key: K): V | undefined {
    return this.map.get(key);
  }

  has(key: K): boolean {
    return this.map.has(key);
  }

  take(key: K): V | undefined {
    const value = this.map.get(key);
    this.map.delete(key);
    return value;
  }
}
