// Only for type-checking the example here (Vercel provides Node's types).
declare const process: { env: Record<string, string | undefined> };
