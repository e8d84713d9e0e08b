// proplab command line (being built up).
int main() { return 0; }
