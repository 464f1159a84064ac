// One writer per conversation across this origin's tabs, with Web Locks.
//
// A tab that shows a conversation it may write holds the Web Lock "kvckpt-chat:<store>:<storeName>:<name>"; another
// tab that opens it finds the lock held and shows it read-only, with a way to take it over (the lock requested with
// `steal`: the first tab hears it lost the conversation, stops its reply and lets go). The engine's own claim of the
// name (the store's lock "kvckpt:<kind>:<storeName>:claim:<name>", held while a reply of it is open in a worker) is
// waited for after a take-over, so the new writer never meets the old one's generation. A BroadcastChannel tells the
// other tabs what was saved, so their lists and read-only views follow.

export class Tabs {
  constructor(store, storeName, { onLost, onSaved }) {
    this.prefix = `kvckpt-chat:${store}:${storeName}:`;
    this.claimPrefix = `kvckpt:${store}:${storeName}:claim:`;
    this.held = new Map();   // name -> release()
    this.onLost = onLost;
    this.channel = new BroadcastChannel(`kvckpt-chat:${store}:${storeName}`);
    this.channel.onmessage = ({ data }) => { if (data.type === "saved") onSaved(data.conversation); };
  }

  holds(name) { return this.held.has(name); }

  // Hold conversation `name` for this tab if no other tab does (or with `steal`, taking it from the one that does);
  // whether it is held now.
  async claim(name, { steal = false } = {}) {
    if (this.held.has(name)) return true;
    const granted = await new Promise((resolve) => {
      const options = steal ? { steal: true } : { ifAvailable: true };
      navigator.locks.request(this.prefix + name, options, (lock) => {
        if (lock === null) return resolve(false);
        return new Promise((release) => { this.held.set(name, release); resolve(true); });
      }).catch((error) => {   // stolen by another tab: this one no longer writes it
        if (this.held.delete(name)) this.onLost(name);
        if (error.name !== "AbortError") throw error;
      });
    });
    return granted;
  }

  // Take conversation `name` from the tab that holds it, then wait until no worker holds its name's claim (the other
  // tab stopped its reply and let go, or is gone).
  async takeOver(name) {
    await this.claim(name, { steal: true });
    await navigator.locks.request(this.claimPrefix + name, async () => {});
  }

  release(name) {
    this.held.get(name)?.();
    this.held.delete(name);
  }

  releaseAll() { for (const name of [...this.held.keys()]) this.release(name); }

  saved(conversation) { this.channel.postMessage({ type: "saved", conversation }); }

  close() {
    this.releaseAll();
    this.channel.close();
  }
}
