/* The kvserve executable's subcommands. Each returns the process exit code; only main()
 * turns it into an exit. */
#ifndef KVS_SERVER_COMMANDS_H
#define KVS_SERVER_COMMANDS_H

/* kvserve generate: load a model and complete one prompt on the command line. */
int cmd_generate(int argc, char **argv);
/* kvserve serve: the OpenAI-compatible HTTP server. */
int cmd_serve(int argc, char **argv);

#endif
